"""The Triton kernels agree with the plain-torch ops they replace (``-m cuda``)."""

from __future__ import annotations

from typing import Callable

import pytest
import torch


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-2) -> None:
    rel = _rel(a, b)
    assert rel <= tol, rel


def _warm_and_capture(step: Callable[[], None]) -> torch.cuda.CUDAGraph:
    """``step`` run once eagerly (Triton compiles outside the capture), then captured in a graph."""
    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_norms_rope_silu_match_torch(dtype):
    from graphtop.models.kernels import fused as tk
    from graphtop.models.layers.norm import RMSNorm

    torch.manual_seed(0)
    dev = "cuda"
    T, H, D, hidden = 37, 16, 128, 1024
    norm = RMSNorm(hidden, 1e-6).to(dev, dtype)
    norm.weight.data.normal_(1.0, 0.1)
    x = torch.randn(T, hidden, device=dev, dtype=dtype)
    _close(tk.rms_norm(x, norm.weight, 1e-6), norm(x))
    # per-head norm on a strided view (q out of a fused qkv)
    qkv = torch.randn(T, (H + 16) * D, device=dev, dtype=dtype)
    q = qkv[:, : H * D].view(T, H, D)
    hn = RMSNorm(D, 1e-6).to(dev, dtype)
    hn.weight.data.normal_(1.0, 0.1)
    _close(tk.rms_norm(q, hn.weight, 1e-6), hn(q))
    # fused add + norm: residual updated in place
    res = torch.randn(T, hidden, device=dev, dtype=dtype)
    ref_res = res + x
    out = tk.add_rms_norm(x, res, norm.weight, 1e-6)
    torch.testing.assert_close(res, ref_res)
    _close(out, norm(ref_res))
    # silu(gate) * up
    gu = torch.randn(T, 2 * 3072, device=dev, dtype=dtype)
    g, u = gu.chunk(2, -1)
    _close(tk.silu_and_mul(gu), torch.nn.functional.silu(g) * u)


@pytest.mark.parametrize("norm", [True, False])
def test_qk_norm_rope_and_store_kv_match_torch(norm):
    from graphtop.models.kernels import fused as tk
    from graphtop.models.layers.norm import RMSNorm
    from graphtop.models.layers.rope import apply_rope

    torch.manual_seed(1)
    dev, dtype, T, H, Hk, D = "cuda", torch.bfloat16, 29, 16, 8, 128
    qkv = torch.randn(T, (H + 2 * Hk) * D, device=dev, dtype=dtype)
    q = qkv[:, : H * D].view(T, H, D)
    k = qkv[:, H * D : (H + Hk) * D].view(T, Hk, D)
    v = qkv[:, (H + Hk) * D :].view(T, Hk, D)
    qn, kn = RMSNorm(D, 1e-6).to(dev, dtype), RMSNorm(D, 1e-6).to(dev, dtype)
    qn.weight.data.normal_(1.0, 0.1)
    kn.weight.data.normal_(1.0, 0.1)
    pos = torch.randint(0, 4000, (T,), device=dev)
    inv = 1.0 / (1e6 ** (torch.arange(0, D, 2, device=dev).float() / D))
    f = torch.arange(4096, device=dev).float()[:, None] * inv[None]
    cache = torch.cat([f.cos(), f.sin()], -1)
    cos, sin = cache[pos].to(dtype).unsqueeze(1).chunk(2, -1)
    rq = apply_rope(qn(q) if norm else q, cos, sin)
    rk = apply_rope(kn(k) if norm else k, cos, sin)
    got_q = tk.qk_norm_rope(pos, q, k, cache, qn.weight if norm else None, kn.weight if norm else None, 1e-6)
    assert got_q.is_contiguous()
    _close(got_q, rq)
    _close(k, rk)
    kc = torch.zeros(100, Hk, D, device=dev, dtype=dtype)
    vc = torch.zeros_like(kc)
    loc = torch.randperm(100, device=dev)[:T]
    tk.store_kv(k, v, kc, vc, loc)
    ek, ev = torch.zeros_like(kc), torch.zeros_like(vc)
    ek.index_copy_(0, loc, k)
    ev.index_copy_(0, loc, v)
    assert torch.equal(kc, ek) and torch.equal(vc, ev)


def test_fused_model_matches_unfused():
    """The fused bf16 model (norm weights folded into the projections after them) is as close to the
    fp32 model as the unfused bf16 one (HF's ops), and its greedy choices flip against fp32 no more often."""
    from graphtop.models.layers.reference_attention import ContiguousAttention
    from graphtop.models.synthetic.random_model import hf_config_for, random_checkpoint

    cfg = hf_config_for("qwen3-0.6b", num_hidden_layers=4)
    a, b = (random_checkpoint(cfg, device="cuda", dtype=torch.bfloat16, seed=3).model for _ in range(2))
    g = torch.Generator(device="cuda").manual_seed(3)
    for la, lb in zip(a.model.layers, b.model.layers):  # norm weights other than one: the fold shows
        for name in ("input_layernorm", "post_attention_layernorm"):
            getattr(la, name).weight.data.normal_(1.0, 0.2, generator=g)
            getattr(lb, name).weight.data.copy_(getattr(la, name).weight.data)
    c = random_checkpoint(cfg, device="cuda", dtype=torch.float32, seed=3).model  # the same weights, in fp32
    c.load_state_dict({k: v.float() for k, v in a.state_dict().items()})
    assert b.enable_fused_kernels()
    decided_rows, flips = 0, [0, 0]
    for t in (8, 50):  # the skinny GEMM with the norms in it, and cuBLAS with the norm kernels
        ids = torch.randint(10, 1000, (t,), device="cuda")
        pos = torch.arange(t, device="cuda")
        with torch.inference_mode():
            la, lb, lc = (m.compute_logits(m(ids, pos, ContiguousAttention())).float() for m in (a, b, c))
        _close(lb, la, tol=2e-2)
        assert _rel(lb, lc) <= 1.2 * _rel(la, lc)
        top2 = lc.topk(2, dim=-1).values
        ulp = torch.exp2(torch.floor(torch.log2(top2[:, 0].abs())) - 7)
        decided = (top2[:, 0] - top2[:, 1]) > 3 * ulp
        decided_rows += int(decided.sum())
        for i, m in enumerate((la, lb)):
            flips[i] += int((m.argmax(-1) != lc.argmax(-1))[decided].sum())
    assert decided_rows >= 10
    assert flips[1] <= flips[0] + 1, flips


@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize("kind", ["plain", "norm", "silu_res", "res_bias"])
@pytest.mark.parametrize(
    "config",
    [None, (8, 512, 4, 2), (8, 512, 4, 2, 2), (8, 256, 4, 2, 2)],
    ids=["picked", "half-k", "split2", "split2-2tiles"],
)
def test_fused_gemv_matches_torch(m, kind, config):
    """The small-batch GEMV with its fused prologue/epilogue equals the torch ops it replaces, with the
    launch config picked for the shape (one K tile) and with two K tiles (the RMSNorm's sum of squares
    and the SiLU·mul prologue carried across them), the launch of Qwen3-0.6B's qkv and gate|up; and
    split over K (one or two tiles a slice; the RMSNorm prologue does not split), its partials merged
    by the last program of each block, which leaves the tickets at zero for the next launch."""
    import torch.nn.functional as F

    from graphtop.models.kernels import gemv as tg
    from graphtop.models.layers.norm import RMSNorm

    torch.manual_seed(m)
    dev, dt, n, k = "cuda", torch.bfloat16, 3000, 1024  # N not a multiple of any block
    w = torch.randn(n, k, device=dev, dtype=dt) * 0.05
    b = torch.randn(n, device=dev, dtype=dt)
    res = torch.randn(m, n, device=dev, dtype=dt)
    if kind == "plain":
        x = torch.randn(m, 2 * k, device=dev, dtype=dt)[:, :k]  # strided rows
        ref, got = F.linear(x, w), tg.gemv(x, w, config=config)
    elif kind == "norm":
        x = torch.randn(m, k, device=dev, dtype=dt) * 3
        ln = RMSNorm(k, 1e-6).to(dev, dt)
        ln.weight.data.normal_(1.0, 0.1)
        ref, got = F.linear(ln(x), w, b), tg.gemv(x, w, b, norm_weight=ln.weight, eps=1e-6, config=config)
    elif kind == "silu_res":
        x = torch.randn(m, 2 * k, device=dev, dtype=dt)
        ref = res + F.linear(F.silu(x[:, :k]) * x[:, k:], w)
        got = tg.gemv(x, w, silu_mul=True, residual=res, out=res, config=config)
        assert got.data_ptr() == res.data_ptr()  # in place on the residual stream
    else:
        x = torch.randn(m, k, device=dev, dtype=dt)
        ref, got = res + F.linear(x, w, b), tg.gemv(x, w, b, residual=res, config=config)
    assert got.shape == ref.shape
    _close(got, ref, tol=4e-3)
    if config is not None and len(config) == 5 and kind != "norm":
        assert int(tg._split_workspace[w.device][1].abs().sum()) == 0


def test_plain_gemv_lets_the_pdl_gemv_after_it_start_early():
    """A GEMV launched without PDL but with ``trigger`` lets the next, PDL-launched one start while its
    last programs run (the 8B's gate|up, then down): the second still reads the first's finished output,
    replayed in a CUDA graph many times as the decode graph runs them."""
    import torch.nn.functional as F

    from graphtop.models.kernels import fused as tk
    from graphtop.models.kernels import gemv as tg

    if not tk.use_pdl(torch.device("cuda"), 0, "on"):
        pytest.skip("programmatic dependent launch needs Hopper or newer")
    torch.manual_seed(4)
    k, inter = 1024, 3584  # the up projection streams long enough for its tail to overlap the next launch
    w_gu = torch.randn(2 * inter, k, device="cuda", dtype=torch.bfloat16) * 0.05
    w_down = torch.randn(k, inter, device="cuda", dtype=torch.bfloat16) * 0.05
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    h = torch.zeros(1, k, device="cuda", dtype=torch.bfloat16)

    def step() -> None:
        gu = tg.gemv(x, w_gu, pdl=False, trigger=True)
        tg.gemv(gu, w_down, silu_mul=True, residual=h, out=h, pdl=True)

    gu = F.linear(x, w_gu)
    want = F.linear(F.silu(gu[:, :inter]) * gu[:, inter:], w_down)
    graph = _warm_and_capture(step)
    for _ in range(50):
        h.zero_()
        graph.replay()
        torch.cuda.synchronize()
        _close(h, want, tol=1e-2)


def test_lm_head_gemv_then_pdl_argmax_in_a_graph():
    """The decode step's tail at the fused GEMV's rows: the final RMSNorm in the lm_head GEMV's prologue
    (plainly launched, triggering), then the greedy argmax launched with PDL. Replayed in a graph on new
    hidden states each time: the logits match RMSNorm + linear, and the tokens are the argmax of the
    logits the GEMV wrote, so the argmax never read a row before the GEMV finished it."""
    import torch.nn.functional as F

    from graphtop.models.kernels import fused as tk
    from graphtop.models.kernels import gemv as tg
    from graphtop.models.kernels.argmax import argmax_rows

    if not tk.use_pdl(torch.device("cuda"), 0, "on"):
        pytest.skip("programmatic dependent launch needs Hopper or newer")
    torch.manual_seed(5)
    vocab, hidden, eps = 128256, 4096, 1e-5
    w = torch.randn(vocab, hidden, device="cuda", dtype=torch.bfloat16) * 0.02
    nw = (1 + 0.1 * torch.randn(hidden, device="cuda")).to(torch.bfloat16)
    x = torch.randn(1, hidden, device="cuda", dtype=torch.bfloat16)
    logits = torch.empty(1, vocab, device="cuda", dtype=torch.bfloat16)
    tokens = torch.zeros(1, dtype=torch.int64, device="cuda")

    def step() -> None:
        tg.gemv(x, w, norm_weight=nw, eps=eps, out=logits, pdl=False, trigger=True)
        argmax_rows(logits, out=tokens, pdl=True)

    graph = _warm_and_capture(step)
    for _ in range(20):
        x.copy_(torch.randn_like(x))
        logits.fill_(float("nan"))
        tokens.fill_(-1)
        graph.replay()
        torch.cuda.synchronize()
        ref = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps) * nw.float()
        _close(logits, F.linear(ref, w.float()), tol=2e-2)
        assert tokens.tolist() == torch.argmax(logits, dim=-1).tolist()


def test_split_k_gemv_is_deterministic():
    """Whichever slice finishes last, the partials are added in slice order: bit-identical reruns."""
    from graphtop.models.kernels import gemv as tg

    torch.manual_seed(3)
    w = torch.randn(1024, 3072, device="cuda", dtype=torch.bfloat16) * 0.05
    x = torch.randn(1, 6144, device="cuda", dtype=torch.bfloat16)
    runs = [tg.gemv(x, w, silu_mul=True, config=(8, 1024, 4, 4, 3)) for _ in range(20)]
    assert all(torch.equal(r, runs[0]) for r in runs)
    _close(runs[0], tg.gemv(x, w, silu_mul=True, config=(8, 1024, 4, 4)), tol=1e-2)


@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("m", [1, 2, 3])  # fused_mlp.MAX_ROWS: the rows a layer runs it at
def test_fused_mlp_matches_the_two_gemvs_in_a_graph(m, pdl):
    """The MLP in one launch (Qwen3-0.6B's shape) against the gate|up and down GEMVs it replaces: within
    an ulp (only the down projection's fp32 sums are added in another order), bit-identical on every
    graph replay (the partials are added in a fixed order, the tickets reset by the last program)."""
    from graphtop.models.kernels import fused as tk
    from graphtop.models.kernels import fused_mlp as tm
    from graphtop.models.kernels import gemv as tg

    if pdl and not tk.use_pdl(torch.device("cuda"), 0, "on"):
        pytest.skip("programmatic dependent launch needs Hopper or newer")
    torch.manual_seed(6 + m)
    hidden, inter, dt = 1024, 3072, torch.bfloat16
    w_gu = torch.randn(2 * inter, hidden, device="cuda", dtype=dt) * hidden**-0.5
    w_down = torch.randn(hidden, inter, device="cuda", dtype=dt) * inter**-0.5
    nw = (1 + 0.1 * torch.randn(hidden, device="cuda")).to(dt)
    x = torch.randn(m, hidden, device="cuda", dtype=dt)
    h, two = x.clone(), x.clone()
    gu = tg.gemv(two, w_gu, norm_weight=nw, eps=1e-6, pdl=pdl)
    tg.gemv(gu, w_down, silu_mul=True, residual=two, out=two, pdl=pdl)
    graph = _warm_and_capture(lambda: tm.fused_mlp(h, w_gu, w_down, nw, 1e-6, pdl=pdl))
    outs = []
    for _ in range(10):
        h.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        outs.append(h.clone())
    assert all(torch.equal(o, outs[0]) for o in outs)
    assert all(int(ws.tickets.abs().sum()) == 0 for ws in tm._workspaces.values())
    # in ulps of the largest of the outputs and the terms added, the MLP's output among them: where it and
    # the residual cancel, the output is only as precise as they are (tests/kernels/test_fused_mlp.py)
    terms = (outs[0].float(), two.float(), x.float(), two.float() - x.float())
    scale = torch.stack([t.abs() for t in terms]).amax(0)
    ulp = torch.exp2(torch.floor(torch.log2(scale)) - 7)
    assert ((outs[0].float() - two.float()).abs() <= ulp).all()


def test_fused_gemv_layers_match_cublas_layers():
    """Decode-sized batches through the GEMV layers agree with the same model on its cuBLAS layers."""
    from graphtop.models.layers.reference_attention import ContiguousAttention
    from graphtop.models.synthetic.random_model import hf_config_for, random_checkpoint

    cfg = hf_config_for("qwen3-0.6b", num_hidden_layers=4)
    a = random_checkpoint(cfg, device="cuda", dtype=torch.bfloat16, seed=5).model
    b = random_checkpoint(cfg, device="cuda", dtype=torch.bfloat16, seed=5).model
    c = random_checkpoint(cfg, device="cuda", dtype=torch.bfloat16, seed=5).model
    assert a.enable_fused_kernels(gemv_max_rows=0) and b.enable_fused_kernels(gemv_max_rows=4)  # 4: opt-in
    assert c.enable_fused_kernels(gemv_max_rows=4, fused_mlp=True) and c.fused_mlp_layers() == 4
    assert b.model.gemv_max_rows == 4 and a.model.gemv_max_rows == 0 and b.fused_mlp_layers() == 0
    for t in (1, 3, 4):
        ids = torch.randint(10, 1000, (t,), device="cuda")
        pos = torch.arange(t, device="cuda")
        with torch.inference_mode():
            la = a.compute_logits(a(ids, pos, ContiguousAttention()))
            lb = b.compute_logits(b(ids, pos, ContiguousAttention()))
            lc = c.compute_logits(c(ids, pos, ContiguousAttention()))
        _close(lb, la, tol=2e-2)  # RMSNorm's scale applied after the dot product: other rounding
        _close(lc, lb, tol=2e-2)  # the MLP in one launch: the down projection's sums in another order
        # greedy choices agree wherever the cuBLAS layers' top-2 margin is wider than a few bf16 ulps
        top2 = la.topk(2, dim=-1).values
        ulp = torch.exp2(torch.floor(torch.log2(top2[:, 0].abs())) - 7)
        decided = (top2[:, 0] - top2[:, 1]) > 3 * ulp
        assert (la.argmax(-1) == lb.argmax(-1))[decided].all()


def test_argmax_rows_matches_torch_with_ties():
    from graphtop.models.kernels.argmax import argmax_rows

    torch.manual_seed(2)
    for vocab in (1000, 4096, 128256, 151936):
        x = torch.randn(5, vocab, device="cuda")
        x[1, 7] = x[1, vocab - 1] = 50.0  # tie across chunks: the lowest index wins, as in torch
        if vocab > 4096:
            x[2, 4095] = x[2, 4096] = 60.0  # a tie across the first chunk boundary
        assert argmax_rows(x).tolist() == torch.argmax(x, dim=-1).tolist()
        assert argmax_rows(x[:1]).tolist() == torch.argmax(x[:1], dim=-1).tolist()


def test_argmax_rows_writes_the_host_ring_row_the_device_slot_picks():
    """In a captured graph replayed with a new slot each time, every replay's tokens land in that row
    of the pinned ring (and in ``out``), and the other rows keep what earlier replays wrote."""
    from graphtop.models.kernels.argmax import argmax_rows, host_ring_supported

    torch.manual_seed(3)
    rows, vocab = 6, 151936
    x = torch.randn(rows, vocab, device="cuda", dtype=torch.bfloat16)
    assert host_ring_supported(x)
    ring = torch.full((4, 8), -1, dtype=torch.int64, pin_memory=True)
    slot = torch.zeros(1, dtype=torch.int32, device="cuda")
    out = torch.zeros(8, dtype=torch.int64, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        argmax_rows(x, out=out[:rows], host_ring=(ring, slot))
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        argmax_rows(x, out=out[:rows], host_ring=(ring, slot))
    want = {}
    for step in range(6):
        x.copy_(torch.randn_like(x))
        slot.fill_(step % 4)
        g.replay()
        done = torch.cuda.Event()
        done.record()
        done.synchronize()  # the host reads the ring after the step's event, as the overlap schedule does
        want[step % 4] = torch.argmax(x.float(), dim=-1).tolist()
        assert ring[step % 4, :rows].tolist() == want[step % 4] == out[:rows].tolist()
        assert all(ring[r, :rows].tolist() == w for r, w in want.items())
    assert ring[:, rows:].eq(-1).all()  # rows past the batch untouched


@pytest.mark.parametrize("heads", [(16, 8), (32, 8), (20, 4)], ids=lambda h: f"h{h[0]}kv{h[1]}")
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize(
    "splits,min_chunk,tier",
    [
        (None, 256, "default"),
        (1, 256, "default"),
        (16, 16, "default"),
        (None, 256, "prefetch1"),
        (16, 16, "prefetch0"),
        (None, 64, "smallgroup"),
        (16, 64, "smallgroup"),
        (None, 256, "large"),
        (16, 32, "large"),
        (None, 256, "huge"),
        (16, 32, "huge"),
        (None, 256, "regcap"),
        (16, 32, "regcap"),
        (None, 256, "onerow"),
        (16, 256, "onerow"),
    ],
)
def test_triton_paged_decode_matches_reference(heads, page_size, splits, min_chunk, tier):
    """The one-launch split-KV decode kernel against plain softmax attention, on ragged contexts
    (1 … 4096 tokens, page edges) over shuffled pages, run twice (tickets reset between launches);
    both entries: q over stored K/V, and straight from q|k|v (norm, RoPE and the K/V store inside)."""
    from dataclasses import replace

    from graphtop.models.kernels.decode_attention import PagedDecode
    from graphtop.models.kernels.decode_attention_tuning import (
        HUGE_TUNING,
        LARGE_ROWS,
        LARGE_TUNING,
        ONE_ROW_TUNING,
        SMALL_GROUP_TUNING,
        DecodeTuning,
    )
    from graphtop.models.kernels.qkv_input import QKVInput
    from graphtop.models.layers.norm import RMSNorm
    from graphtop.models.layers.rope import apply_rope

    torch.manual_seed(page_size)
    hq, hkv = heads
    D, dt, dev = 128, torch.bfloat16, "cuda"
    lens = [1, 2, 15, 16, 17, 100, 300, 1000, 2049, 4096]
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
    # "large" / "huge": the launch shapes of batches of LARGE_ROWS / HUGE_ROWS rows and more, on these rows;
    # "prefetch0/1": less requested before the PDL wait than the default (2); "smallgroup": group <= 2's;
    # "regcap": a register cap (maxnreg) below what the compiler takes for that launch (159 registers
    # uncapped, compiled for sm_90 on the CPU; 128 with the cap)
    base = {
        "default": DecodeTuning(),
        "prefetch0": DecodeTuning(prefetch=0),
        "prefetch1": DecodeTuning(prefetch=1),
        "regcap": DecodeTuning(block_t=32, num_warps=2, num_stages=3, maxnreg=128),
        "smallgroup": SMALL_GROUP_TUNING,
        "large": LARGE_TUNING,
        "huge": HUGE_TUNING,
        "onerow": ONE_ROW_TUNING,
    }[tier]
    tuning = replace(base, min_chunk=min_chunk)
    kern = PagedDecode(hq, hkv, D, page_size, D**-0.5, 16, torch.device(dev), tuning)
    assert kern.tuning_for(1) == kern.tuning_for(LARGE_ROWS) == tuning  # a given tuning serves every size
    i32 = dict(dtype=torch.int32, device=dev)
    args = (torch.tensor(indptr, **i32), torch.tensor(idx, **i32), torch.tensor(last, **i32))

    # the q|k|v entry; the reference does norm + RoPE with the model's torch ops and stores K/V itself
    R = len(lens)
    qkv = torch.randn(R, (hq + 2 * hkv) * D, dtype=dt, device=dev)
    pos = torch.tensor([n + 5 for n in lens], device=dev)
    inv_freq = 1e6 ** (-torch.arange(0, D, 2, device=dev).float() / D)
    freqs = torch.arange(8192, device=dev).float()[:, None] * inv_freq[None, :]
    cos_sin = torch.cat((freqs.cos(), freqs.sin()), dim=-1)  # RotaryEmbedding's cache layout
    cos, sin = cos_sin[pos].to(dt).unsqueeze(1).chunk(2, dim=-1)
    qn, kn = RMSNorm(D, 1e-6).to(dev, dt), RMSNorm(D, 1e-6).to(dev, dt)
    with torch.no_grad():
        qn.weight.uniform_(0.5, 1.5)
        kn.weight.uniform_(0.5, 1.5)
        q = qkv[:, : hq * D].view(R, hq, D)
        k = qkv[:, hq * D : (hq + hkv) * D].view(R, hkv, D)
        v = qkv[:, (hq + hkv) * D :].view(R, hkv, D)
        q_ref, k_ref = apply_rope(qn(q), cos, sin), apply_rope(kn(k), cos, sin)
    kc_f, vc_f = kc.clone(), vc.clone()
    outs_qkv = [
        kern.run_qkv(QKVInput(qkv, pos, cos_sin, qn.weight, kn.weight, 1e-6), kc_f, vc_f, *args, splits=splits)
        for _ in range(2)
    ]
    assert torch.equal(outs_qkv[0], outs_qkv[1])
    flat_k, flat_v = kc.view(-1, hkv, D).clone(), vc.view(-1, hkv, D).clone()
    for b, n in enumerate(lens):  # the new token's slot: the last of the row's page list
        pages = idx[indptr[b] : indptr[b + 1]]
        s = pages[(n - 1) // page_size] * page_size + (n - 1) % page_size
        flat_k[s], flat_v[s] = k_ref[b], v[b]
    _close(kc_f.view(-1, hkv, D), flat_k, tol=1e-2)  # RoPE rounding may differ by an ulp
    assert torch.equal(vc_f.view(-1, hkv, D), flat_v)

    # the q entry, over the caches the q|k|v entry wrote: the same attention
    outs = [kern.run(q_ref.contiguous(), kc_f, vc_f, *args, splits=splits) for _ in range(2)]
    assert torch.equal(outs[0], outs[1])
    assert int(kern._tickets.abs().sum()) == 0
    flat_k, flat_v = kc_f.view(-1, hkv, D).float(), vc_f.view(-1, hkv, D).float()
    for b, n in enumerate(lens):
        pages = idx[indptr[b] : indptr[b + 1]]
        slots = torch.tensor([pages[t // page_size] * page_size + t % page_size for t in range(n)], device=dev)
        kk = flat_k[slots].repeat_interleave(hq // hkv, 1)
        vv = flat_v[slots].repeat_interleave(hq // hkv, 1)
        att = (torch.einsum("hd,thd->ht", q_ref[b].float(), kk) * D**-0.5).softmax(-1)
        want = torch.einsum("ht,thd->hd", att, vv)
        _close(outs[0][b], want, tol=1e-2)
        _close(outs_qkv[0][b], want, tol=1e-2)


def test_triton_paged_decode_launch_shape_by_rows():
    """Without a given tuning, the launch shape follows the batch's rows: the default below LARGE_ROWS
    (SMALL_GROUP_TUNING for GQA groups up to SMALL_GROUP), LARGE_TUNING up to HUGE_ROWS, HUGE_TUNING from
    there, and ONE_ROW_TUNING for one row of a GQA group above SMALL_GROUP (head_dim 128: the tiles as
    declared)."""
    from graphtop.models.kernels import decode_attention_tuning as td
    from graphtop.models.kernels.decode_attention import PagedDecode

    kern = PagedDecode(32, 8, 128, 1, 128**-0.5, 8, torch.device("cuda"))
    assert kern.tuning_for(1) == td.ONE_ROW_TUNING
    assert kern.tuning_for(2) == kern.tuning_for(td.LARGE_ROWS - 1) == td.DEFAULT_TUNING
    wide = PagedDecode(32, 8, 256, 1, 256**-0.5, 8, torch.device("cuda"))  # wider heads: half the tile
    assert wide.tuning_for(1).block_t == td.ONE_ROW_TUNING.block_t // 2
    small = PagedDecode(16, 8, 128, 1, 128**-0.5, 8, torch.device("cuda"))  # GQA group 2
    assert small.tuning_for(1) == small.tuning_for(td.LARGE_ROWS - 1) == td.SMALL_GROUP_TUNING
    assert small.tuning_for(td.LARGE_ROWS) == td.LARGE_TUNING
    assert kern.tuning_for(td.LARGE_ROWS) == kern.tuning_for(td.HUGE_ROWS - 1) == td.LARGE_TUNING
    assert kern.tuning_for(td.HUGE_ROWS) == kern.tuning_for(4 * td.HUGE_ROWS) == td.HUGE_TUNING
    assert kern.splits_for(td.HUGE_ROWS) == 1  # 256 rows x 8 KV heads fill the SMs without splits


def test_fast_launches_give_the_logits_tritons_own_launches_give():
    """Eager decode through ``FastKernel`` (every fast launch checked against Triton's own binding) equals,
    bit for bit, the same forwards launched by Triton, at 1 and 3 rows, with the MLP in one launch or not."""
    from graphtop.models.kernels import launch
    from graphtop.models.layers.reference_attention import ContiguousAttention
    from graphtop.models.synthetic.random_model import hf_config_for, random_checkpoint

    cfg = hf_config_for("qwen3-0.6b", num_hidden_layers=4)
    for fused_mlp in (False, True):
        model = random_checkpoint(cfg, device="cuda", dtype=torch.bfloat16, seed=7).model
        assert model.enable_fused_kernels(gemv_max_rows=4, fused_mlp=fused_mlp)
        for t in (1, 3):
            ids = torch.randint(10, 1000, (t,), device="cuda")
            pos = torch.arange(t, device="cuda")
            with torch.inference_mode():
                launch.ENABLED = False
                try:
                    want = model.decode_logits(ids, pos, ContiguousAttention()).clone()
                finally:
                    launch.ENABLED = True
                model.decode_logits(ids, pos, ContiguousAttention())  # fills the plans, if the first was not
                fast = sum(k.fast_launches for k in launch._KERNELS.values())
                with launch.verifying():
                    got = model.decode_logits(ids, pos, ContiguousAttention())
            assert sum(k.fast_launches for k in launch._KERNELS.values()) > fast
            assert torch.equal(got, want), (fused_mlp, t)
