"""The stream-K split of the skinny GEMM (``models/kernels/stream_k.py``): the host-side table the
kernel walks, so its invariants are checked here on the CPU (the kernel itself: ``tests/cuda/test_cuda_skinny.py``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from graphtop.models.kernels import skinny_tuning as tuning
from graphtop.models.kernels import stream_k as sk


@given(slabs=st.integers(1, 300), tiles=st.integers(1, 64), programs=st.integers(1, 400))
def test_every_unit_once_segments_in_unit_order(slabs: int, tiles: int, programs: int) -> None:
    programs = min(programs, slabs * tiles)  # what stream_k_programs allows
    progs, per_slab = sk.stream_k_split(slabs, tiles, programs)
    assert len(progs) == programs and len(per_slab) == slabs
    # the programs tile the units in order, their shares differing by at most one unit
    assert progs[0][0] == 0 and progs[-1][1] == slabs * tiles
    assert all(a[1] == b[0] for a, b in zip(progs, progs[1:]))
    sizes = [u1 - u0 for u0, u1, _ in progs]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1
    # segments: a program's units cut at slab boundaries, numbered in unit order
    segments: list[tuple[int, int, int]] = []  # (slab, first unit, end unit)
    for u0, u1, first_seg in progs:
        assert first_seg == len(segments)
        u = u0
        while u < u1:
            end = min(u1, (u // tiles + 1) * tiles)
            segments.append((u // tiles, u, end))
            u = end
    for slab, (first, count) in enumerate(per_slab):
        mine = segments[first : first + count]
        assert count >= 1 and all(s == slab for s, _, _ in mine)
        # the slab's segments cover its K tiles once, in order: the merge sums them in K order
        assert mine[0][1] == slab * tiles and mine[-1][2] == (slab + 1) * tiles
        assert all(a[2] == b[1] for a, b in zip(mine, mine[1:]))
    assert sum(c for _, c in per_slab) == len(segments)


def test_programs_per_sm_and_config_check() -> None:
    assert sk.stream_k_programs(0, 132, 3072) == 132
    assert sk.stream_k_programs(-2, 132, 3072) == 264
    assert sk.stream_k_programs(-2, 132, 100) == 100  # never more programs than units
    # a stream-K config needs whole slabs and whole K tiles, nothing about splits
    assert tuning.config_ok(6144, 4096, (64, 128, 0, 4, 4))
    assert tuning.config_ok(28672, 4096, (128, 64, 0, 4, 4), silu=True)
    assert not tuning.config_ok(6144, 4096, (64, 384, 0, 4, 4))
    assert not tuning.config_ok(6100, 4096, (64, 128, 0, 4, 4))
