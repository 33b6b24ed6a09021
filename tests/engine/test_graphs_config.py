"""Graph config (default bucket lists, limits, locks, downgrades, JSON) and the static-buffer registry
(padding policies, fixed addresses), tested directly without a model."""

from __future__ import annotations

import pytest
import torch

from graphtop.engine.graphs.buffers import BufferRegistry, BufferSlot, PaddingPolicy, StaticBufferError
from graphtop.engine.graphs.config import (
    GraphConfig,
    GraphConfigError,
    build_graph_config,
    clamp_buckets,
    default_decode_buckets,
    default_prefill_buckets,
    resolve_graph_config,
)


def spec_decode(max_bs: int) -> list[int]:
    """The decode list as the spec words it: [1,2,4,8,12] + 16..256 step 8 + 272..496 step 16 +
    512.. step 32, capped at max_bs."""
    sizes = [1, 2, 4, 8, 12]
    for start, stop, step in ((16, 256, 8), (272, 496, 16), (512, max(max_bs, 512), 32)):
        s = start
        while s <= stop:
            sizes.append(s)
            s += step
    return [s for s in sizes if s <= max_bs]


def spec_prefill(max_tokens: int) -> list[int]:
    """4..32 step 4, 48..256 step 16, 288..512 step 32, 576..1024 step 64, 1280..4096 step 256,
    then step 512, capped at max_tokens."""
    sizes: list[int] = []
    ranges = (
        (4, 32, 4),
        (48, 256, 16),
        (288, 512, 32),
        (576, 1024, 64),
        (1280, 4096, 256),
        (4608, max(max_tokens, 4608), 512),
    )
    for start, stop, step in ranges:
        s = start
        while s <= stop:
            sizes.append(s)
            s += step
    return [s for s in sizes if s <= max_tokens]


@pytest.mark.parametrize("max_bs", [1, 3, 8, 12, 13, 100, 256, 257, 300, 496, 512, 600, 1000])
def test_default_decode_buckets(max_bs):
    got = default_decode_buckets(max_bs)
    assert got == spec_decode(max_bs)
    assert got == sorted(set(got)) and got[-1] <= max_bs


def test_default_decode_bucket_landmarks():
    full = default_decode_buckets(1024)
    assert full[:8] == [1, 2, 4, 8, 12, 16, 24, 32]
    assert full[full.index(256) : full.index(256) + 3] == [256, 272, 288]
    assert full[full.index(496) : full.index(496) + 3] == [496, 512, 544]
    assert full[-1] == 1024


@pytest.mark.parametrize("max_tokens", [3, 4, 30, 33, 100, 256, 512, 1000, 2048, 4096, 5000, 10000])
def test_default_prefill_buckets(max_tokens):
    got = default_prefill_buckets(max_tokens)
    assert got == spec_prefill(max_tokens)
    assert got == sorted(set(got)) and all(s <= max_tokens for s in got)


def test_default_prefill_bucket_landmarks():
    full = default_prefill_buckets(6000)
    assert full[:9] == [4, 8, 12, 16, 20, 24, 28, 32, 48]
    for a, b in ((256, 288), (512, 576), (1024, 1280), (4096, 4608)):
        assert full[full.index(a) + 1] == b
    assert full[-2:] == [5120, 5632]


def resolve(cfg=None, *, max_running=256, pool_tokens=1 << 20, chunk=2048, capturable=True):
    return resolve_graph_config(
        cfg or GraphConfig(),
        max_running=max_running,
        pool_tokens=pool_tokens,
        chunked_prefill_size=chunk,
        cuda_graphs_available=False,
        attention_supports_decode_graph=capturable,
    )


def test_resolved_defaults():
    r = resolve()
    assert r.decode_bs == spec_decode(256) and r.prefill_num_tokens == spec_prefill(2048)
    assert r.emulated and not r.downgrades and r.decode_backend == "full" and r.prefill_backend == "breakable"


@pytest.mark.parametrize(
    "pool_tokens,expected_tail", [(100, [96, 100]), (96, [80, 96]), (1000, [960, 1000]), (5, [4, 5]), (3, [3])]
)
def test_prefill_defaults_filtered_by_pool_size_and_pool_size_appended(pool_tokens, expected_tail):
    got = resolve(pool_tokens=pool_tokens, max_running=2).prefill_num_tokens
    assert got == sorted(set(spec_prefill(pool_tokens) + [pool_tokens]))
    assert got[-len(expected_tail) :] == expected_tail


@pytest.mark.parametrize(
    "max_running,expected",
    [(1, [1]), (8, [1, 2, 4, 8]), (10, [1, 2, 4, 8, 10]), (100, spec_decode(96) + [100]), (300, spec_decode(256))],
)
def test_decode_defaults_capped_and_request_pool_size_appended(max_running, expected):
    assert resolve(max_running=max_running).decode_bs == expected


def test_chunk_size_caps_prefill_defaults_without_appending():
    assert resolve(chunk=100).prefill_num_tokens == spec_prefill(100)  # 100 is off-grid: not a pool limit
    assert resolve(chunk=2).prefill_num_tokens == []  # nothing fits: no prefill graphs


def test_clamp_buckets():
    assert clamp_buckets([3, 1, 2, 1], 8) == [1, 2, 3]  # sorted, de-duplicated, nothing cut: nothing appended
    assert clamp_buckets([4, 16, 32], 8) == [4, 8]  # cut: the limit itself is appended
    assert clamp_buckets([4, 8, 16], 8) == [4, 8]  # ... once
    assert clamp_buckets([16], 8) == [8]
    assert clamp_buckets([], 8) == []


def test_locked_keys_are_never_downgraded():
    cfg = build_graph_config(
        None,
        {"decode.bs": [1, 2, 64], "decode.max_bs": 64, "prefill.num_tokens": [8, 1024], "prefill.max_num_tokens": 1024},
    )
    assert cfg.locked == {"decode.bs", "decode.max_bs", "prefill.num_tokens", "prefill.max_num_tokens"}
    r = resolve(cfg, max_running=8, pool_tokens=1024, chunk=256)
    assert r.decode_bs == [1, 2, 64] and r.prefill_num_tokens == [8, 1024]
    assert r.downgrades == [] and r.locked == frozenset(cfg.locked)


def test_unlocked_keys_are_downgraded_and_reported():
    cfg = GraphConfig(decode_bs=[1, 2, 64], decode_max_bs=64, prefill_num_tokens=[8, 4096], prefill_max_num_tokens=4096)
    assert cfg.locked == set()
    r = resolve(cfg, max_running=8, pool_tokens=1024, chunk=256)
    assert r.decode_bs == [1, 2, 8] and r.prefill_num_tokens == [8, 256]
    by_key = {d.key: d for d in r.downgrades}
    assert set(by_key) == {"decode.max_bs", "decode.bs", "prefill.max_num_tokens", "prefill.num_tokens"}
    assert (by_key["decode.max_bs"].old, by_key["decode.max_bs"].new) == (64, 8)
    assert (by_key["decode.bs"].old, by_key["decode.bs"].new) == ([1, 2, 64], [1, 2, 8])
    assert (by_key["prefill.max_num_tokens"].old, by_key["prefill.max_num_tokens"].new) == (4096, 256)
    assert (by_key["prefill.num_tokens"].old, by_key["prefill.num_tokens"].new) == ([8, 4096], [8, 256])
    assert all(d.reason for d in r.downgrades)


def test_uncapturable_attention_downgrades_decode_unless_locked():
    r = resolve(capturable=False)
    assert r.decode_backend == "disabled" and r.decode_bs == []
    assert [(d.key, d.old, d.new) for d in r.downgrades] == [("decode.backend", "full", "disabled")]
    with pytest.raises(GraphConfigError, match="cannot be captured"):
        resolve(build_graph_config(None, {"decode.backend": "full"}), capturable=False)


def test_disabled_phases_have_no_buckets():
    r = resolve(build_graph_config('{"decode": {"backend": "disabled"}, "prefill": {"backend": "disabled"}}', {}))
    assert (r.decode_backend, r.decode_bs, r.prefill_backend, r.prefill_num_tokens) == ("disabled", [], "disabled", [])


def test_json_beats_flags_and_both_lock():
    cfg = build_graph_config(
        '{"decode": {"bs": [2, 1, 2]}, "prefill": {"max_padding_waste": 0.5}}',
        {"decode.bs": [4, 8], "prefill.backend": "disabled", "decode.max_bs": None},
    )
    assert cfg.decode_bs == [1, 2] and cfg.prefill_backend == "disabled" and cfg.prefill_max_padding_waste == 0.5
    assert cfg.locked == {"decode.bs", "prefill.backend", "prefill.max_padding_waste"}
    assert build_graph_config(None, {"decode.bs": "8, 1,2"}).decode_bs == [1, 2, 8]


@pytest.mark.parametrize(
    "text,message",
    [
        ("{bad", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"decode": {"backend": "piecewise"}}', "unknown decode.backend 'piecewise'"),
        ('{"prefill": {"backend": "full"}}', "unknown prefill.backend 'full'"),
        ('{"decode": {"bs": [0, 1]}}', "decode.bs: '0': buckets must be ≥ 1"),
        ('{"decode": {"bs": [-4]}}', "decode.bs: '-4': buckets must be ≥ 1"),
        ('{"decode": {"bs": []}}', "decode.bs: empty: give at least one bucket"),
        ('{"decode": {"bs": [1, true]}}', "decode.bs: 'True' is not an integer"),
        ('{"decode": {"max_bs": 0}}', "decode.max_bs must be positive"),
        ('{"prefill": {"num_tokens": [64, -1]}}', "prefill.num_tokens: '-1': buckets must be ≥ 1"),
        ('{"prefill": {"max_num_tokens": "lots"}}', "must be an integer"),
        ('{"prefill": {"max_padding_waste": -0.1}}', "max_padding_waste must be a finite number >= 0"),
        ('{"prefill": {"max_padding_waste": NaN}}', "NaN is not a finite number"),
        ('{"prefill": {"max_padding_waste": 1e400}}', "max_padding_waste must be a finite number >= 0"),
        (
            '{"decode": {"bs": [' + ",".join(map(str, range(1, 15001))) + "]}}",
            "15,000 items, over the limit of 512 buckets",
        ),
        ('{"decode": {"bs": 1' + "0" * 5000 + "}}", "cuda graph config: "),
        ('{"decode": ' + "[" * 100000 + "]" * 100000 + "}", "nested too deeply"),
        ('{"decode": {"colour": 1}}', "unknown key 'decode.colour'"),
        ('{"mixed": {}}', "unknown phase 'mixed'"),
        ('{"decode": [1, 2]}', "decode must be a JSON object"),
    ],
)
def test_invalid_graph_config_is_one_line_error(text, message):
    with pytest.raises(GraphConfigError) as info:
        build_graph_config(text, {})
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(prefill_num_tokens=[0, 8]), "prefill.num_tokens: '0': buckets must be ≥ 1"),
        (dict(decode_bs=[1.5, 2]), "decode.bs: '1.5' is not an integer"),
        (dict(decode_backend="bogus"), "unknown decode.backend 'bogus'"),
        (dict(prefill_backend=None), "unknown prefill.backend None"),
        (dict(decode_max_bs=0), "decode.max_bs must be positive"),
        (dict(prefill_max_padding_waste=float("nan")), "max_padding_waste must be a finite number >= 0"),
        (dict(prefill_max_padding_waste="x"), "max_padding_waste must be a finite number >= 0, got 'x'"),
        (dict(decode_bs=(1, 2)), "decode.bs must be a list of integers"),
    ],
)
def test_python_built_graph_config_gets_the_json_checks(kwargs, message):
    """A GraphConfig built in Python is held to the rules JSON and flags are; resolving it checks too."""
    cfg = GraphConfig(**kwargs)
    for check in (cfg.validate, lambda: resolve(cfg)):
        with pytest.raises(GraphConfigError) as info:
            check()
        assert message in str(info.value) and "\n" not in str(info.value)


def test_validated_normalises_a_copy_and_keeps_empty_lists():
    cfg = GraphConfig(decode_bs=[4, 1, 4], prefill_num_tokens="8,16", prefill_max_padding_waste=0)
    cfg.locked.add("decode.bs")
    got = cfg.validated()
    assert (got.decode_bs, got.prefill_num_tokens, got.prefill_max_padding_waste) == ([1, 4], [8, 16], 0.0)
    assert got.locked == {"decode.bs"} and got.locked is not cfg.locked
    assert (cfg.decode_bs, cfg.prefill_num_tokens) == ([4, 1, 4], "8,16")  # the caller's object is untouched
    assert GraphConfig(decode_bs=[]).validated().decode_bs == []  # phase on, no graphs (no_graphs_captured)


# --- static buffers -----------------------------------------------------------------------------

STALE = 42


def _registry(max_size: int = 8) -> BufferRegistry:
    reg = BufferRegistry(torch.device("cpu"), max_size)
    rows = lambda b, p: b["rows"]  # noqa: E731
    reg.declare(BufferSlot("keep", lambda n: (n,), torch.int64, PaddingPolicy.KEEP_PAD, pad_value=-1, source=rows))
    reg.declare(
        BufferSlot(
            "sentinel",
            lambda n: (n, 3),
            torch.int64,
            PaddingPolicy.FILL_SENTINEL,
            pad_value=7,
            source=lambda b, p: b["table"],
        )
    )
    reg.declare(
        BufferSlot(
            "zero", lambda n: (n,), torch.float32, PaddingPolicy.ZERO, pad_value=5.0, source=lambda b, p: b["vals"]
        )
    )
    reg.declare(
        BufferSlot(
            "whole",
            lambda n: (n,),
            torch.int64,
            PaddingPolicy.FOREACH_COPY,
            source=lambda b, p: b["rows"] + [100 + i for i in range(p - len(b["rows"]))],
        )
    )
    reg.declare(BufferSlot("once", lambda n: (n,), torch.int64, PaddingPolicy.FILL_ONCE, pad_value=9, source=rows))
    reg.declare(
        BufferSlot(
            "cols",
            lambda n: (2, n),
            torch.int64,
            PaddingPolicy.FILL_SENTINEL,
            pad_value=-3,
            source=lambda b, p: [b["rows"], b["rows"]],
            axis=1,
        )
    )
    return reg


def _batch(n: int) -> dict:
    return {
        "rows": [10 + i for i in range(n)],
        "table": [[i, i + 1] for i in range(n)],  # 2 of 3 columns: the last column is never sourced
        "vals": [0.5 * (i + 1) for i in range(n)],
    }


def test_allocation_values_per_policy():
    reg = _registry()
    assert reg["once"].tolist() == [9] * 8  # FILL_ONCE: pad value from allocation on
    assert reg["sentinel"].eq(7).all() and reg["cols"].eq(-3).all()
    assert reg["keep"].eq(0).all() and reg["zero"].eq(0).all()  # other policies start zeroed


def test_padding_tails_per_policy():
    reg = _registry()
    for buf in reg.buffers.values():
        buf.fill_(STALE)
    reg.fill(_batch(3), padded=6)
    s = STALE
    assert reg["keep"].tolist() == [10, 11, 12, s, s, s, s, s]  # KEEP_PAD: tail keeps stale contents
    assert reg["sentinel"].tolist() == [[0, 1, s], [1, 2, s], [2, 3, s]] + [[7, 7, 7]] * 3 + [[s, s, s]] * 2
    assert reg["zero"].tolist() == [0.5, 1.0, 1.5, 0.0, 0.0, 0.0, s, s]  # ZERO: tail zeroed, not pad_value
    assert reg["whole"].tolist() == [10, 11, 12, 100, 101, 102, s, s]  # FOREACH_COPY: source covers the pad
    assert reg["once"].tolist() == [s] * 8  # FILL_ONCE: never written per step
    assert reg["cols"].tolist() == [[10, 11, 12, -3, -3, -3, s, s]] * 2  # padding along axis 1

    reg.fill(_batch(1), padded=2)  # a smaller step only rewrites its own rows
    assert reg["keep"].tolist() == [10, 11, 12, s, s, s, s, s]
    assert reg["sentinel"][:3].tolist() == [[0, 1, s], [7, 7, 7], [2, 3, s]]
    assert reg["zero"].tolist()[:3] == [0.5, 0.0, 1.5]


def test_addresses_never_change_and_views_alias_buffers():
    reg = _registry()
    before = reg.addresses()
    for n, padded in ((3, 4), (8, 8), (1, 1), (5, 8)):
        reg.fill(_batch(n), padded)
        assert reg.addresses() == before
        assert reg.view("keep", padded).data_ptr() == reg["keep"].data_ptr()
        assert reg.view("cols", padded).shape == (2, padded) and reg.view("cols", padded).data_ptr() == before["cols"]
    reg.reset()
    assert reg.addresses() == before
    assert reg["keep"].eq(-1).all() and reg["zero"].eq(5.0).all() and reg["once"].eq(9).all()


def test_fill_is_one_transfer_and_one_scatter(monkeypatch):
    """Every slot's live rows and padded tail, whatever its dtype, plus extra uploads and device-held
    sources, go through one staged copy and one byte-wise ``_foreach_copy_`` (graphs/upload.py)."""
    from graphtop.engine.graphs.upload import Upload

    reg = _registry()
    calls = []
    real = torch._foreach_copy_

    def spy(dsts, srcs, *args, **kwargs):
        calls.append(({d.dtype for d in dsts}, len(dsts)))
        return real(dsts, srcs, *args, **kwargs)

    monkeypatch.setattr(torch, "_foreach_copy_", spy)
    extra = torch.zeros(3, dtype=torch.int32)
    ids = torch.tensor([70, 71], dtype=torch.int64)  # a device source (the CPU is this test's device)
    reg.fill(
        _batch(2),
        padded=4,
        extra=[Upload(extra, torch.tensor([4, 5, 6], dtype=torch.int32))],
        device_sources={"keep": ids},
    )
    assert len(calls) == 1 and calls[0][0] == {torch.uint8}
    assert extra.tolist() == [4, 5, 6] and reg["keep"][:2].tolist() == [70, 71]
    assert reg["zero"][2:4].eq(0).all() and reg["sentinel"][2:4].eq(7).all() and reg["cols"][:, 2:4].eq(-3).all()


def test_a_strided_view_gets_its_own_typed_copy():
    from graphtop.engine.graphs.upload import StepUploader, Upload

    table = torch.zeros(4, 6, dtype=torch.int64)
    flat = torch.zeros(5, dtype=torch.int32)
    StepUploader(torch.device("cpu")).send(
        [Upload(table[:2, :3], torch.arange(6).view(2, 3)), Upload(flat[:2], torch.tensor([8, 9], dtype=torch.int32))]
    )
    assert table[:2, :3].flatten().tolist() == list(range(6)) and table[2:].eq(0).all() and table[:, 3:].eq(0).all()
    assert flat.tolist() == [8, 9, 0, 0, 0]
    with pytest.raises(ValueError, match="upload of"):
        StepUploader(torch.device("cpu")).send([Upload(flat[:2], torch.tensor([1, 2]))])  # int64 into int32


def test_fill_only_named_slots():
    reg = _registry()
    reg.fill(_batch(2), padded=2, names=["keep"])
    assert reg["keep"][:2].tolist() == [10, 11] and reg["whole"].eq(0).all()


def test_data_that_does_not_fit_is_refused():
    reg = _registry(max_size=4)
    with pytest.raises(StaticBufferError, match="does not fit"):
        reg.fill(_batch(5), padded=5)
    with pytest.raises(ValueError, match="declared twice"):
        reg.declare(BufferSlot("keep", lambda n: (n,), torch.int64, PaddingPolicy.KEEP_PAD))


def test_bucket_over_the_pool_is_refused_even_when_locked():
    """The issue's example: --cuda-graph-bs-decode 1000000000 was killed by the OOM killer at 22.9 GB."""
    for key, flags in (
        ("decode.bs", {"decode.bs": [1, 1_000_000_000]}),
        ("prefill.num_tokens", {"prefill.num_tokens": [16, 4097]}),
    ):
        with pytest.raises(GraphConfigError) as info:
            resolve(build_graph_config(None, flags), max_running=8, pool_tokens=4096, chunk=256)
        assert f"{key} bucket" in str(info.value) and "over the KV pool's 4,096 tokens" in str(info.value)
    disabled = build_graph_config(None, {"decode.bs": [10**9], "decode.backend": "disabled"})
    assert resolve(disabled, pool_tokens=4096).decode_bs == []


def test_locked_maximum_over_the_pool_is_refused():
    for key in ("decode.max_bs", "prefill.max_num_tokens"):
        with pytest.raises(GraphConfigError, match=f"{key} 1,000,000,000 is over the KV pool's 4,096 tokens"):
            resolve(build_graph_config(None, {key: 10**9}), max_running=8, pool_tokens=4096, chunk=256)


def test_large_locked_decode_maximum_resolves_without_building_millions_of_defaults():
    """Defaults are built only up to the limit they are clamped to; the result is the same list."""
    for running in (8, 600, 100_000):
        a = resolve(build_graph_config(None, {"decode.max_bs": 10**7}), max_running=running, pool_tokens=10**7)
        b = resolve(build_graph_config(None, {"decode.max_bs": 10**5 + 1000}), max_running=running, pool_tokens=10**7)
        assert a.decode_bs == b.decode_bs and a.decode_bs[-1] == min(running, 10**5 + 1000)
