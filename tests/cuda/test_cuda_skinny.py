"""The split-K skinny GEMM equals torch's GEMM (and SiLU·mul), is deterministic, replays in a CUDA graph,
and a model on it agrees with the same model on cuBLAS (``-m cuda``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("m", [2, 8, 17, 64])
@pytest.mark.parametrize(
    "silu,cfg",
    [
        (False, (32, 128, 1, 4, 4)),
        (False, (16, 128, 4, 4, 3)),
        (False, (16, 256, 2, 4, 4)),
        (True, (32, 128, 1, 4, 4)),
        (True, (16, 64, 2, 4, 3)),
        (False, (32, 128, 0, 4, 4)),
        (True, (32, 128, 0, 4, 4)),
        (False, (16, 128, -2, 4, 3)),
    ],
)  # stream-K: 1 and 2 programs an SM
def test_skinny_matches_torch_and_is_deterministic(m, silu, cfg):
    from graphtop.models.kernels import fused as tk
    from graphtop.models.kernels import skinny as ts

    torch.manual_seed(m)
    n, k = 1024, 2048
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05
    x = torch.randn(m, 2 * k, device="cuda", dtype=torch.bfloat16)[:, :k]  # strided rows
    ref = F.linear(x, w)
    if silu:
        ref = tk.silu_and_mul(ref)
    got = ts.skinny(x, w, silu_mul=silu, config=cfg)
    assert got.shape == ref.shape
    assert _rel(got, ref) < 4e-3
    for _ in range(3):  # the split merge sums in split order whoever finishes last: bit-identical
        assert torch.equal(ts.skinny(x, w, silu_mul=silu, config=cfg), got)


@pytest.mark.parametrize("m", [65, 130, 256])
@pytest.mark.parametrize(
    "silu,cfg",
    [(False, (64, 64, 1, 8, 4)), (False, (64, 64, 4, 8, 3)), (False, (128, 64, 4, 8, 3)), (True, (64, 64, 2, 8, 3))],
)
def test_skinny_above_64_rows_matches_torch_and_adds_like_hf(m, silu, cfg):
    """The row classes 128 and 256 (an activation tile up to 256 wide), with the configs the 256-row
    sweep picked: the product, SiLU·mul, and ``skinny_add``'s residual and slab sums of squares."""
    from graphtop.models.kernels import fused as tk
    from graphtop.models.kernels import skinny as ts

    torch.manual_seed(m)
    n, k = 1024, 2048
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    ref = F.linear(x, w)
    if silu:
        ref = tk.silu_and_mul(ref)
    got = ts.skinny(x, w, silu_mul=silu, config=cfg)
    assert got.shape == ref.shape and _rel(got, ref) < 4e-3
    assert torch.equal(ts.skinny(x, w, silu_mul=silu, config=cfg), got)
    if silu:
        return
    res = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    want = (res.float() + got.float()).to(torch.bfloat16)  # HF's add: the product rounded, then the sum
    ss = ts.skinny_add(x, w, res, config=cfg)
    assert torch.equal(res, want)
    torch.testing.assert_close(ss.sum(0)[:m], res.float().pow(2).sum(1), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("m", [3, 8, 40, 64])
@pytest.mark.parametrize("pair", ["o->gate_up", "down->qkv", "down->lm_head"])
@pytest.mark.parametrize("stream_k", [False, True], ids=["shipped", "stream_k"])
def test_norms_in_projections_are_as_close_to_fp32_as_the_separate_kernels(m, pair, stream_k):
    """With the Llama-3.1-8B's projections and their shipped configs: ``skinny_add`` leaves the residual
    the add+RMSNorm kernel leaves, bit for bit, and its slab partials sum to the rows' squares; the
    projection that takes them (the norm's weight folded into its own, the row scale applied to its
    sums) is at least as close to the fp32 result as HF's rounding (add+RMSNorm kernel, then the
    projection); both are deterministic. Also with both on stream-K launches of the same tiles. The last
    down projection and the lm_head (the final norm folded in) are such a pair too."""
    import torch.nn.functional as F

    from graphtop.models.kernels import fused as tk
    from graphtop.models.kernels import skinny as ts
    from graphtop.models.kernels import skinny_tuning as st

    torch.manual_seed(m)
    d = 4096
    k, n = {"o->gate_up": (4096, 28672), "down->qkv": (14336, 6144), "down->lm_head": (14336, 128256)}[pair]
    cls = st.row_class(m)
    silu = pair == "o->gate_up"  # the 8B's gate|up has SiLU·mul configs at both row classes
    producer, consumer = st.configs_for(d, k)[cls], st.configs_for(n, d, silu)[cls]
    if stream_k:
        producer, consumer = (c[:2] + (0,) + c[3:] for c in (producer, consumer))
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(d, k, device="cuda", dtype=torch.bfloat16) * 0.02
    wn = torch.randn(n, d, device="cuda", dtype=torch.bfloat16) * 0.02
    residual = torch.randn(m, d, device="cuda", dtype=torch.bfloat16)
    nw = torch.rand(d, device="cuda", dtype=torch.bfloat16) + 0.5
    hf_res = residual.clone()
    hf = ts.skinny(
        tk.add_rms_norm(ts.skinny(x, w, config=producer), hf_res, nw, 1e-5), wn, config=consumer, silu_mul=silu
    )
    got_res = residual.clone()
    partials = ts.skinny_add(x, w, got_res, config=producer)
    assert torch.equal(got_res, hf_res)
    sums = (got_res.float() ** 2).sum(1)
    assert torch.allclose(partials.sum(0)[:m], sums, rtol=1e-5) and not partials[:, m:].any()
    folded = wn * nw[None, :]
    norm = ts.NormInput(partials, 1e-5)
    got = ts.skinny(got_res, folded, config=consumer, silu_mul=silu, norm=norm)
    h32 = got_res.float() * torch.rsqrt(sums[:, None] / d + 1e-5) * nw.float()
    exact = F.linear(h32, wn.float())
    if silu:
        exact = F.silu(exact[:, : n // 2]) * exact[:, n // 2 :]
    assert _rel(got, exact) <= 1.1 * _rel(hf, exact) + 1e-4
    again_res = residual.clone()
    assert torch.equal(ts.skinny_add(x, w, again_res, config=producer), partials)
    assert torch.equal(ts.skinny(again_res, folded, config=consumer, silu_mul=silu, norm=norm), got)


@pytest.mark.parametrize("cfg", [(16, 128, 4, 4, 3), (16, 128, 0, 4, 3)], ids=["split_k", "stream_k"])
def test_skinny_replays_in_a_graph(cfg):
    """Split tickets reset themselves: replay after replay gives eager's result, bit for bit."""
    from graphtop.models.kernels import skinny as ts

    torch.manual_seed(0)
    w = torch.randn(1024, 3072, device="cuda", dtype=torch.bfloat16) * 0.05
    x = torch.randn(8, 3072, device="cuda", dtype=torch.bfloat16)
    eager = ts.skinny(x, w, config=cfg)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ts.skinny(x, w, config=cfg)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = ts.skinny(x, w, config=cfg)
    for _ in range(3):
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, ts.skinny(x, w, config=cfg))


@pytest.mark.parametrize("post_norm_apart", [False, True], ids=["norms_in", "post_norm_apart"])
def test_skinny_layers_match_cublas_layers(post_norm_apart):
    """A Qwen3-0.6B-shaped model (4 layers) with the skinny GEMM on its tuned projections agrees with
    the same model on cuBLAS at 2-64 rows; greedy choices agree wherever the margin is decided. Also
    with the post-attention add+RMSNorm as its own kernel (``st.POST_NORM_APART``)."""
    from graphtop.models.kernels import skinny_tuning as st
    from graphtop.models.synthetic.random_model import hf_config_for, random_checkpoint

    cfg = hf_config_for("qwen3-0.6b", num_hidden_layers=4)
    a = random_checkpoint(cfg, device="cuda", dtype=torch.bfloat16, seed=5).model
    b = random_checkpoint(cfg, device="cuda", dtype=torch.bfloat16, seed=5).model
    assert a.enable_fused_kernels(gemv_max_rows=0, skinny=False) and b.enable_fused_kernels(gemv_max_rows=0)
    layer = b.model.layers[0]
    assert all(layer.kernels.skinny) and not any(a.model.layers[0].kernels.skinny)  # every 0.6B projection has a config
    assert layer.kernels.norms_in_projections == {16, 64} - {c for h, c in st.NORMS_APART if h == 1024}
    for other in b.model.layers:  # the path the 0.6B keeps off at 16 rows agrees too
        other.kernels.norms_in_projections = frozenset({16, 64})
        other.kernels.post_norm_apart = other.kernels.norms_in_projections if post_norm_apart else frozenset()
    _assert_models_agree(a, b, (2, 8, 40, 64))


def test_llama_8b_layers_as_shipped_match_cublas_layers():
    """The Llama-3.1-8B shape (2 layers) as it ships: the norms in the projections at 2-64 rows (at
    17-64 the o projection split two ways, adding into the residual), against cuBLAS."""
    from graphtop.models.synthetic.random_model import hf_config_for, random_checkpoint

    cfg = hf_config_for("llama-3.1-8b", num_hidden_layers=2)
    a = random_checkpoint(cfg, device="cuda", dtype=torch.bfloat16, seed=7).model
    b = random_checkpoint(cfg, device="cuda", dtype=torch.bfloat16, seed=7).model
    assert a.enable_fused_kernels(gemv_max_rows=0, skinny=False) and b.enable_fused_kernels(gemv_max_rows=0)
    layer = b.model.layers[0]
    kernels = layer.kernels
    assert all(kernels.skinny) and kernels.norms_in_projections == {16, 64} and not kernels.post_norm_apart
    _assert_models_agree(a, b, (2, 8, 40, 64))


def _assert_models_agree(a, b, rows) -> None:
    """b's logits within 2 % of a's at each row count; greedy choices agree wherever a's margin is
    more than 3 ulp."""
    from graphtop.models.layers.reference_attention import ContiguousAttention

    for t in rows:
        ids = torch.randint(10, 1000, (t,), device="cuda")
        pos = torch.arange(t, device="cuda")
        with torch.inference_mode():
            la = a.compute_logits(a(ids, pos, ContiguousAttention()))
            lb = b.compute_logits(b(ids, pos, ContiguousAttention()))
        assert _rel(lb, la) < 2e-2
        top2 = la.topk(2, dim=-1).values
        ulp = torch.exp2(torch.floor(torch.log2(top2[:, 0].abs())) - 7)
        decided = (top2[:, 0] - top2[:, 1]) > 3 * ulp
        assert (la.argmax(-1) == lb.argmax(-1))[decided].all()


def test_concurrent_threads_do_not_mix_split_partials():
    """Two threads on their own streams (the serving thread and the parity re-run) launching split-K
    GEMMs at once each get eager's bits every time."""
    import threading

    from graphtop.models.kernels import skinny as ts

    torch.manual_seed(1)
    w = torch.randn(1024, 3072, device="cuda", dtype=torch.bfloat16) * 0.05
    xs = [torch.randn(8, 3072, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    cfg = (16, 128, 4, 4, 3)
    want = [ts.skinny(x, w, config=cfg) for x in xs]
    bad: list[int] = []

    def run(i: int) -> None:
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            outs = [ts.skinny(xs[i], w, config=cfg) for _ in range(200)]
        s.synchronize()
        bad.extend(j for j, o in enumerate(outs) if not torch.equal(o, want[i]))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


@pytest.mark.parametrize("m", [3, 8, 40, 64])
@pytest.mark.parametrize(
    "silu,cfg",
    [(False, (64, 128, 1, 4, 4)), (False, (16, 256, 4, 4, 3)), (True, (64, 64, 1, 4, 3)), (True, (32, 128, 2, 4, 4))],
)
def test_packed_weights_equal_the_row_major_ones(m, silu, cfg):
    """``pack`` + ``packed=True``: the same tiles in the same order from contiguous blocks give
    bit-identical products, SiLU·mul, norms, residual adds and slab squares, in a graph too."""
    from graphtop.models.kernels import skinny as ts

    torch.manual_seed(m)
    n, k = 1024, 2048
    w = torch.randn(2 * n if silu else n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
    wp = ts.pack(w, cfg, silu)
    x = torch.randn(m, 2 * k, device="cuda", dtype=torch.bfloat16)[:, :k]  # strided rows
    res = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    ss = torch.rand(4, max(16, 1 << (m - 1).bit_length()), device="cuda") * k

    def run(weight: torch.Tensor, packed: bool) -> list[torch.Tensor]:
        outs = [ts.skinny(x, weight, config=cfg, silu_mul=silu, norm=ts.NormInput(ss, 1e-6), packed=packed)]
        if not silu:
            r = res.clone()
            outs += [ts.skinny_add(x, weight, r, config=cfg, packed=packed), r]
        return outs

    for a, b in zip(run(wp, True), run(w, False)):
        assert torch.equal(a, b)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = ts.skinny(x, wp, config=cfg, silu_mul=silu, packed=True)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, ts.skinny(x, w, config=cfg, silu_mul=silu))


@pytest.mark.parametrize("shape", ["qwen3-0.6b", "llama-3.1-8b"])
def test_models_on_packed_weights_equal_the_row_major_ones(shape, monkeypatch):
    """``enable_fused_kernels(packed=True)``: a model whose skinny projections read packed copies (at the
    shipped ``PACKED`` entries, and the 0.6B's 64-row class) gives the same logits, bit for bit, as the
    same model reading its weights row-major, at every row count; the copies fit in ``packed_copy_bytes``."""
    from graphtop.models.kernels import skinny_tuning as st
    from graphtop.models.layers.reference_attention import ContiguousAttention
    from graphtop.models.synthetic.random_model import hf_config_for, random_checkpoint

    monkeypatch.setattr(st, "PACKED", st.PACKED | {(1024, 64)})
    cfg = hf_config_for(shape, num_hidden_layers=2)
    a = random_checkpoint(cfg, device="cuda", dtype=torch.bfloat16, seed=3).model
    b = random_checkpoint(cfg, device="cuda", dtype=torch.bfloat16, seed=3).model
    assert a.enable_fused_kernels(gemv_max_rows=0) and b.enable_fused_kernels(gemv_max_rows=0, packed=True)
    assert any(b.model.layers[0].kernels.packed) and not any(a.model.layers[0].kernels.packed)
    copies = sum(
        w.numel() * w.element_size() for layer in b.model.layers for d in layer.kernels.packed for w in d.values()
    )
    assert 0 < copies <= b.packed_copy_bytes()

    for t in (2, 8, 40, 64):
        ids = torch.randint(10, 1000, (t,), device="cuda")
        pos = torch.arange(t, device="cuda")
        with torch.inference_mode():
            la = a.compute_logits(a(ids, pos, ContiguousAttention()))
            lb = b.compute_logits(b(ids, pos, ContiguousAttention()))
        assert torch.equal(la, lb), t
