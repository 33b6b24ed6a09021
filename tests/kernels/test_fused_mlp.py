"""The one-launch MLP (models/kernels/fused_mlp.py): which layers take it, what it computes, and that it compiles
for Hopper with programmatic dependent launch.

No GPU: the numerics run in Triton's interpreter (``TRITON_INTERPRET=1`` must be set before Triton is
imported, so in a subprocess), against the two fused-GEMV launches it replaces, interpreted too, and a
torch reference with the same rounding points; the PDL variants compile for sm_90 against a stand-in
driver (tests/support/triton_host.py). Both skip without Triton. The GPU runs are
tests/cuda/test_cuda_kernels.py's and bench/ab_decode.py's (mlp=fused).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.fused_layers import fused_layer
from torch import nn

from graphtop.models.kernels import fused_mlp as tm
from graphtop.models.layers import linear


def test_a_layer_takes_the_one_launch_mlp_only_when_asked_and_its_mlp_is_plain_and_bias_free() -> None:
    layer = fused_layer()
    assert not layer.kernels.fused_mlp  # off until set
    layer.set_fused_mlp(True, "auto")
    assert layer.kernels.fused_mlp and not layer.kernels.fused_mlp_pdl  # no PDL off CUDA
    layer.set_fused_mlp(False, "auto")
    assert not layer.kernels.fused_mlp
    biased = fused_layer("llama-3.1-8b", mlp_bias=True)  # Llama reads mlp_bias; Qwen3 has none
    biased.set_fused_mlp(True, "auto")
    assert not biased.kernels.fused_mlp

    class RowShard(nn.Linear):  # a tensor-parallel down projection all-reduces in its own gemv_add
        pass

    sharded = fused_layer()
    down = sharded.mlp.down_proj
    sharded.mlp.down_proj = RowShard(down.in_features, down.out_features, bias=False, device="meta")
    sharded.set_fused_mlp(True, "on")
    assert not sharded.kernels.fused_mlp


def test_the_small_mlp_is_one_launch_when_fused_and_two_gemvs_otherwise(monkeypatch) -> None:
    calls: list[tuple] = []
    monkeypatch.setattr(tm, "fused_mlp", lambda h, gu, d, nw, eps, **kw: calls.append(("fused", kw)))
    monkeypatch.setattr(linear.tg, "gemv", lambda x, w, b=None, **kw: calls.append(("gemv", kw)) or x)
    layer = fused_layer()
    h = torch.empty(1, 8, device="meta")
    layer.bind_small().mlp(h)
    assert [c[0] for c in calls] == ["gemv", "gemv"]
    calls.clear()
    layer.set_fused_mlp(True, "auto")  # a new setting: the small path is bound again at its next use
    assert layer.small is None
    layer.bind_small().mlp(h)
    assert calls == [("fused", {"pdl": False, "trigger": linear.tg.TRIGGER_NEXT})]
    calls.clear()
    layer.small.mlp(torch.empty(tm.MAX_ROWS + 1, 8, device="meta"))  # past its rows: the two GEMVs
    assert [c[0] for c in calls] == ["gemv", "gemv"]


def test_default_configs_tile_their_shapes() -> None:
    for (hidden, inter), cfg in tm.DEFAULTS.items():
        programs = -(-inter // cfg.block_i)
        assert inter % cfg.block_i == 0 and hidden % cfg.block_k == 0 and hidden % cfg.block_h == 0
        assert programs >= 132 and 1 <= cfg.group <= programs, ((hidden, inter), cfg)
    assert tm.pick_config(256, 768) == tm.FusedMLPConfig(16, 256, 512, 4, 2, 7)


# Runs in a subprocess with TRITON_INTERPRET=1: each case's fused launch against the two GEMV launches and a
# torch reference, as the largest difference in units in the last place of the activation dtype.
INTERPRETED = r"""
import json, sys
import torch
from graphtop.models.kernels import fused_mlp as tm, gemv

BITS = {torch.bfloat16: 7, torch.float16: 10}

def ulps(a, b, dt, *scale):
    # in ulps of the largest of the compared values and the terms added (an output near zero, where the
    # residual and the MLP's output cancel, is as precise as they are)
    a, b = a.float(), b.float()
    _, e = torch.frexp(torch.stack([t.float().abs() for t in (a, b, *scale)]).amax(0))
    return ((a - b).abs() / torch.exp2((e - 1 - BITS[dt]).float())).max().item()

# fp32 -> bf16 as the interpreter converts it: Triton 3.9's truncates (a GPU rounds to nearest even)
probe = torch.zeros(1, 16)
probe[0, 0] = 1 + 0.75 * 2**-7  # between 1 and the next bf16 value, nearer the next
TRUNCATES = gemv.gemv(probe, torch.eye(16, dtype=torch.bfloat16), pdl=False)[0, 0].item() == 1.0

def rounded(t, dt):
    if dt is torch.bfloat16 and TRUNCATES:
        return (t.float().contiguous().view(torch.int32) & -65536).view(torch.float32)
    return t.to(dt).float()

def case(m, hidden, inter, dt, cfg, stride):
    g = torch.Generator().manual_seed(m * 1000 + hidden)
    base = torch.randn(m, stride, generator=g).to(dt)
    h = base[:, :hidden]  # rows may be strided
    wgu = (torch.randn(2 * inter, hidden, generator=g) / hidden**0.5).to(dt)
    wd = (torch.randn(hidden, inter, generator=g) / inter**0.5).to(dt)
    nw = (1 + 0.1 * torch.randn(hidden, generator=g)).to(dt)
    two = h.clone()
    gu = gemv.gemv(two, wgu, norm_weight=nw, eps=1e-6, pdl=False)
    gemv.gemv(gu, wd, silu_mul=True, residual=two, out=two, pdl=False)
    x = h.float()
    terms = (h, two.float() - x)
    xn = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * nw.float()
    gur = rounded(xn @ wgu.float().t(), dt)
    act = rounded(rounded(torch.nn.functional.silu(gur[:, :inter]), dt) * gur[:, inter:], dt)
    ref = rounded(x + rounded(act @ wd.float().t(), dt), dt).to(dt)
    one = h.clone()
    tm.fused_mlp(one, wgu, wd, nw, 1e-6, config=cfg)
    again = h.clone()
    tm.fused_mlp(again, wgu, wd, nw, 1e-6, config=cfg)  # the same workspace, tickets reset by the last
    tickets = [int(w.tickets.abs().sum()) for w in tm._workspaces.values()]
    inplace = base.clone()
    tm.fused_mlp(inplace[:, :hidden], wgu, wd, nw, 1e-6, config=cfg)
    return {
        "case": [m, hidden, inter, str(dt), list(cfg) if cfg else None, stride],
        "vs_two": ulps(one, two, dt, *terms),
        "vs_two_plain": ulps(one, two, dt),
        "vs_two_abs": (one.float() - two.float()).abs().max().item(),
        "vs_ref": ulps(one, ref, dt, *terms),
        "two_vs_ref": ulps(two, ref, dt, *terms),
        "repeat_equal": bool(torch.equal(one, again)),
        "tickets": sum(tickets),
        "in_place": bool(torch.equal(inplace[:, :hidden], one) and torch.equal(inplace[:, hidden:], base[:, hidden:])),
    }

cases = []
for m in range(1, tm.MAX_ROWS + 1):
    cases.append((m, 256, 768, torch.bfloat16, None, 256))  # 48 programs in 7 groups, the last of 6
    cases.append((m, 200, 300, torch.bfloat16, tm.FusedMLPConfig(16, 64, 32, 4, 2, 5), 232))  # ragged tiles
cases.append((2, 256, 768, torch.float16, None, 256))
cases.append((1, 256, 768, torch.bfloat16, tm.FusedMLPConfig(32, 128, 64, 4, 2, 24), 256))  # one group
cases.append((3, 256, 768, torch.bfloat16, tm.FusedMLPConfig(16, 128, 64, 4, 2, 1), 256))  # one a group
print(json.dumps([case(*c) for c in cases]))
"""


@pytest.fixture(scope="module")
def interpreted() -> list[dict]:
    triton = pytest.importorskip("triton")
    if tuple(int(p) for p in triton.__version__.split(".")[:2]) < (3, 7):
        # its interpreter cannot loop over program-id bounds (the GEMV's K loop); compiled code can
        pytest.skip(f"Triton {triton.__version__}'s interpreter cannot run the GEMV kernel")
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run(
        [sys.executable, "-c", INTERPRETED], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_interpreted_kernel_matches_the_two_gemv_launches_and_the_reference(interpreted) -> None:
    assert len(interpreted) == 2 * 3 + 3
    for r in interpreted:
        # the two paths differ only in the order of the down projection's fp32 sums
        assert r["vs_two"] <= 1.0, r
        # the reference sums gate|up in other orders too: a gate|up value one ulp off moves the output more
        assert r["vs_ref"] <= 2.0 and r["two_vs_ref"] <= 2.0, r


def test_the_interpreted_kernel_is_deterministic_resets_its_tickets_and_writes_only_its_rows(interpreted) -> None:
    for r in interpreted:
        assert r["repeat_equal"] and r["tickets"] == 0 and r["in_place"], r


def test_the_pdl_variants_compile_for_hopper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Recorded from launches on CPU tensors with USE_PDL, compiled for sm_90: a cubin, griddepcontrol in it."""
    pytest.importorskip("triton")
    from support.triton_host import hopper_driver
    from triton import knobs

    from graphtop.models.kernels import precompile

    if not precompile.supported():  # pragma: no cover - an old Triton
        pytest.skip("this Triton has no jit_cache_hook")
    monkeypatch.delenv(precompile.CACHE_ENV, raising=False)
    previous = knobs.cache.dir
    folder = precompile.point_triton_cache(tmp_path / "triton")
    try:
        bf16 = torch.bfloat16
        with hopper_driver():
            with precompile.record_missing() as missing:
                for m, hidden, inter in ((1, 1024, 3072), (3, 1024, 3072), (1, 4096, 14336)):
                    h = torch.randn(m, hidden, dtype=bf16)
                    wgu, wd = torch.empty(2 * inter, hidden, dtype=bf16), torch.empty(hidden, inter, dtype=bf16)
                    tm.fused_mlp(h, wgu, wd, torch.ones(hidden, dtype=bf16), 1e-6, pdl=True)
            assert [v.label for v in missing] == ["fused_mlp._fused_mlp_kernel"] * 3
            for variant in missing:
                precompile.compile_variant(variant)
                assert precompile.is_cached(variant)
        assert folder is not None
        cubins = list(folder.rglob("_fused_mlp_kernel.cubin"))
        ptx = [p.read_text() for p in folder.rglob("_fused_mlp_kernel.ptx")]
        assert len(cubins) == 3 and all(c.stat().st_size > 0 for c in cubins)
        assert len(ptx) == 3
        assert all("griddepcontrol.wait" in p and "griddepcontrol.launch_dependents" in p for p in ptx)
        assert all(".target sm_90" in p for p in ptx)
    finally:
        knobs.cache.dir = previous
