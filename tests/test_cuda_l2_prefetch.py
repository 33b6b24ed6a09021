"""Asking weights and K/V rows into L2 before the PDL wait (models/l2_prefetch.py) is a hint: every
kernel that does it gives bit for bit what it gives without, in a graph too (``-m cuda``)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _pdl() -> bool:
    from graphtop.models import triton_kernels as tk

    return tk.use_pdl(torch.device("cuda"))


@pytest.mark.parametrize("case", ["o", "split2", "partial_block", "silu_res"])
def test_gemv_with_l2_prefetch_equals_without(case):
    """One row through the fused GEMV: whole slabs (one request a program), K split in two (one request
    a row), a last block past N (rows clipped) and the SiLU·mul prologue with the residual add."""
    from graphtop.models import triton_gemv as tg

    if not _pdl():
        pytest.skip("the prefetch rides on programmatic dependent launch (Hopper)")
    torch.manual_seed(1)
    n, k, cfg = {"o": (4096, 4096, None), "split2": (1024, 2048, (8, 1024, 4, 4, 2)),
                 "partial_block": (3000, 1024, None), "silu_res": (1024, 3072, (8, 1024, 4, 4, 3))}[case]
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05
    x = torch.randn(1, 2 * k if case == "silu_res" else k, device="cuda", dtype=torch.bfloat16)
    res = torch.randn(1, n, device="cuda", dtype=torch.bfloat16)

    def run(l2: bool) -> torch.Tensor:
        r = res.clone()
        if case == "silu_res":
            return tg.gemv(x, w, silu_mul=True, residual=r, out=r, config=cfg, pdl=True, l2_prefetch=l2)
        return tg.gemv(x, w, residual=r, config=cfg, pdl=True, l2_prefetch=l2)

    want = run(False)
    for _ in range(3):
        assert torch.equal(run(True), want)


@pytest.mark.parametrize("m", [8, 64])
@pytest.mark.parametrize("case", ["plain", "split2", "silu", "add"])
def test_skinny_with_l2_prefetch_equals_without(m, case):
    """2-64 rows through the skinny GEMM: a whole slab a program, K split in two (a request per row),
    gate and up slabs (SiLU·mul) and the residual add with its square sums."""
    from graphtop.models import triton_skinny as ts

    if not _pdl():
        pytest.skip("the prefetch rides on programmatic dependent launch (Hopper)")
    torch.manual_seed(m)
    n, k = 1024, 2048
    cfg = (16, 256, 2, 4, 4) if case == "split2" else (32, 128, 1, 4, 4)
    silu = case == "silu"
    w = torch.randn(2 * n if silu else n, k, device="cuda", dtype=torch.bfloat16) * 0.05
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    res = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)

    def run(l2: bool) -> tuple[torch.Tensor, ...]:
        if case == "add":
            r = res.clone()
            ss = ts.skinny_add(x, w, r, config=cfg, pdl=True, l2_prefetch=l2)
            return r, ss
        return (ts.skinny(x, w, silu_mul=silu, config=cfg, pdl=True, l2_prefetch=l2),)

    want = run(False)
    for _ in range(3):
        assert all(torch.equal(a, b) for a, b in zip(run(True), want))


def test_skinny_with_l2_prefetch_replays_in_a_graph():
    """The prefetching launch captures and replays: the same bits as eager, after new inputs too."""
    from graphtop.models import triton_skinny as ts

    if not _pdl():
        pytest.skip("the prefetch rides on programmatic dependent launch (Hopper)")
    torch.manual_seed(0)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) * 0.05
    x = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16)
    cfg = (32, 256, 1, 4, 6)
    ts.skinny(x, w, config=cfg, pdl=True, l2_prefetch=True)  # compile and workspace outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = ts.skinny(x, w, config=cfg, pdl=True, l2_prefetch=True)
    for seed in (1, 2):
        x.copy_(torch.randn(8, 4096, generator=torch.Generator().manual_seed(seed)).to("cuda", torch.bfloat16))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, ts.skinny(x, w, config=cfg, pdl=True))


@pytest.mark.parametrize("rows_tuning", ["default", "smallgroup", "large"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_decode_attention_with_l2_prefetch_equals_without(rows_tuning, page_size):
    """The decode kernel straight from q|k|v with the next one or two tiles' K/V rows asked into L2
    (prefetch 3, 4) writes the same cache rows and attention output as with prefetch 2, on ragged
    contexts over shuffled pages (rows past a share read page 0's addresses: harmless)."""
    from graphtop.engine.attention.triton_decode import (
        LARGE_TUNING,
        SMALL_GROUP_TUNING,
        DecodeTuning,
        PagedDecode,
    )

    if not _pdl():
        pytest.skip("the prefetch rides on programmatic dependent launch (Hopper)")
    torch.manual_seed(page_size)
    hq, hkv, D, dt, dev = 32, 8, 128, torch.bfloat16, "cuda"
    lens = [2, 17, 100, 193, 300, 1000, 2049]
    npages = sum(-(-n // page_size) for n in lens) + 1
    kc = torch.randn(npages, page_size, hkv, D, dtype=dt, device=dev)
    vc = torch.randn(npages, page_size, hkv, D, dtype=dt, device=dev)
    perm = (torch.randperm(npages - 1) + 1).tolist()
    indptr, idx, last = [0], [], []
    for n in lens:
        p = -(-n // page_size)
        idx += perm[len(idx) : len(idx) + p]
        indptr.append(len(idx))
        last.append(n - (p - 1) * page_size)
    i32 = dict(dtype=torch.int32, device=dev)
    pages = (torch.tensor(indptr, **i32), torch.tensor(idx, **i32), torch.tensor(last, **i32))
    R = len(lens)
    qkv = torch.randn(R, (hq + 2 * hkv) * D, dtype=dt, device=dev)
    pos = torch.tensor([n + 5 for n in lens], device=dev)
    inv_freq = 1e6 ** (-torch.arange(0, D, 2, device=dev).float() / D)
    freqs = torch.arange(8192, device=dev).float()[:, None] * inv_freq[None, :]
    cos_sin = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    base = {"default": DecodeTuning(), "smallgroup": SMALL_GROUP_TUNING, "large": LARGE_TUNING}[rows_tuning]

    def run(prefetch: int) -> tuple[torch.Tensor, ...]:
        kern = PagedDecode(hq, hkv, D, page_size, D**-0.5, 16, torch.device(dev), replace(base, prefetch=prefetch),
                           pdl=True)
        k2, v2 = kc.clone(), vc.clone()
        out = kern.run_qkv(qkv, pos, cos_sin, None, None, 1e-6, k2, v2, *pages)
        return out, k2, v2

    want = run(2)
    for prefetch in (3, 4):
        got = run(prefetch)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), prefetch


def test_decoder_layers_pass_the_projection_switches():
    """``l2_prefetch.PROJECTIONS`` reaches each layer's switches, and a model prefetching every
    projection runs 1, 8 and 64 rows (fused GEMV, skinny GEMM) to the same logits as one prefetching none."""
    from graphtop.models import l2_prefetch as l2p
    from graphtop.models.random_model import hf_config_for, random_checkpoint
    from graphtop.models.reference_attention import ContiguousAttention

    if not _pdl():
        pytest.skip("the prefetch rides on programmatic dependent launch (Hopper)")
    cfg = hf_config_for("qwen3-0.6b", num_hidden_layers=2)  # its projections have skinny configs at 8 and 64
    shipped = l2p.PROJECTIONS
    try:
        l2p.PROJECTIONS = frozenset()
        a = random_checkpoint(cfg, device="cuda", dtype=torch.bfloat16, seed=3).model
        assert a.enable_fused_kernels()
        l2p.PROJECTIONS = frozenset(l2p.NAMES)
        b = random_checkpoint(cfg, device="cuda", dtype=torch.bfloat16, seed=3).model
        assert b.enable_fused_kernels()
    finally:
        l2p.PROJECTIONS = shipped
    assert all(layer.l2_prefetch == (False,) * 4 for layer in a.model.layers)
    assert all(layer.l2_prefetch == (True,) * 4 for layer in b.model.layers)
    for t in (1, 8, 64):
        ids = torch.randint(10, 1000, (t,), device="cuda")
        pos = torch.arange(t, device="cuda")
        with torch.inference_mode():
            la = a.compute_logits(a(ids, pos, ContiguousAttention()))
            lb = b.compute_logits(b(ids, pos, ContiguousAttention()))
        assert torch.equal(la, lb), t
