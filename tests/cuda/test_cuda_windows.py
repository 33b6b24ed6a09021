"""Sliding windows and logit soft caps on CUDA (``-m cuda``): the Triton decode kernel's per-layer window, the
FlashInfer backend's per-window wrappers (eager decode and prefill, a captured decode graph) against the
torch-native backend, and whole engines of the window families against transformers and against each other.

The windows are computed on the device from each row's length (the page lists the graph reads), so one
captured graph serves rows on both sides of the window; the batches here mix them.
"""

from __future__ import annotations

import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from support.token_agreement import Recorder, _assert_agree, serve

from graphtop.engine.attention.base import AttentionShape
from graphtop.engine.attention.torch_native import TorchNativeBackend
from graphtop.engine.batch import ForwardBatch, ForwardMode
from graphtop.engine.graphs.buffers import BufferRegistry
from graphtop.engine.kv_pool import KVLayout, KVPool

D, DTYPE, REL_TOL = 128, torch.bfloat16, 1e-2
CTX = [1, 2, 15, 16, 17, 33, 100, 300, 1000, 2049]  # both sides of the windows below, page edges


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-6)).item()


def _rand(*shape: int, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32).to(DTYPE)


# --- the Triton kernel's window ----------------------------------------------------------------------
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("splits", [None, 1, 16])
@pytest.mark.parametrize("window", [1, 7, 16, 300])
def test_triton_decode_window_matches_reference(page_size, splits, window):
    """Both entries (q over stored K/V, and straight from q|k|v with the new token's store) attend to the
    last ``window`` keys of each row only, split or not."""
    from graphtop.models.kernels.decode_attention import PagedDecode
    from graphtop.models.kernels.qkv_input import QKVInput
    from graphtop.models.layers.rope import apply_rope

    torch.manual_seed(window + page_size)
    hq, hkv = 16, 4
    npages = sum(-(-n // page_size) for n in CTX) + 1
    kc = torch.randn(npages, page_size, hkv, D, dtype=DTYPE, device="cuda")
    vc = torch.randn(npages, page_size, hkv, D, dtype=DTYPE, device="cuda")
    perm = (torch.randperm(npages - 1) + 1).tolist()
    indptr, idx, last = [0], [], []
    for n in CTX:
        p = -(-n // page_size)
        idx += perm[len(idx) : len(idx) + p]
        indptr.append(len(idx))
        last.append(n - (p - 1) * page_size)
    i32 = dict(dtype=torch.int32, device="cuda")
    pages = (torch.tensor(indptr, **i32), torch.tensor(idx, **i32), torch.tensor(last, **i32))
    kern = PagedDecode(hq, hkv, D, page_size, D**-0.5, 16, torch.device("cuda"))
    R = len(CTX)
    qkv = torch.randn(R, (hq + 2 * hkv) * D, dtype=DTYPE, device="cuda")
    pos = torch.tensor([n - 1 for n in CTX], device="cuda")
    inv_freq = 1e4 ** (-torch.arange(0, D, 2, device="cuda").float() / D)
    freqs = torch.arange(4096, device="cuda").float()[:, None] * inv_freq[None, :]
    cos_sin = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    cos, sin = cos_sin[pos].to(DTYPE).unsqueeze(1).chunk(2, dim=-1)
    q_ref = apply_rope(qkv[:, : hq * D].view(R, hq, D), cos, sin)
    out_qkv = kern.run_qkv(QKVInput(qkv, pos, cos_sin), kc, vc, *pages, splits=splits, window=window)
    out = kern.run(q_ref.contiguous(), kc, vc, *pages, splits=splits, window=window)  # over what run_qkv stored
    assert int(kern._tickets.abs().sum()) == 0
    flat_k, flat_v = kc.view(-1, hkv, D).float(), vc.view(-1, hkv, D).float()
    for b, n in enumerate(CTX):
        row_pages = idx[indptr[b] : indptr[b + 1]]
        keys = range(max(0, n - window), n)
        slots = torch.tensor([row_pages[t // page_size] * page_size + t % page_size for t in keys], device="cuda")
        kk = flat_k[slots].repeat_interleave(hq // hkv, 1)
        vv = flat_v[slots].repeat_interleave(hq // hkv, 1)
        att = (torch.einsum("hd,thd->ht", q_ref[b].float(), kk) * D**-0.5).softmax(-1)
        want = torch.einsum("ht,thd->hd", att, vv)
        assert _rel(out[b], want) <= REL_TOL, f"context {n}"
        assert _rel(out_qkv[b], want) <= REL_TOL, f"context {n} (q|k|v entry)"


# --- FlashInfer's per-window wrappers vs torch-native ---------------------------------------------------
def _pool(page_size: int, num_pages: int, hkv: int) -> KVPool:
    pool = KVPool(KVLayout(2, hkv, D, DTYPE), num_pages, page_size, torch.device("cuda"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    for t in (*pool.k_cache, *pool.v_cache):
        t.copy_(torch.randn(t.shape, generator=gen, device="cuda", dtype=torch.float32))
    return pool


def _batch(pool: KVPool, cases: list[tuple[int, int]], rng: random.Random, decode: bool) -> ForwardBatch:
    """(cached prefix, new tokens) per request, on shuffled pages."""
    counts = [pool.pages_for(p + e) for p, e in cases]
    free = pool.alloc(sum(counts))
    rng.shuffle(free)
    pages, loc, pos, i = [], [], [], 0
    for c, (p, e) in zip(counts, cases):
        pages.append(free[i : i + c])
        i += c
        loc += pool.slots(pages[-1], p, p + e)
        pos += range(p, p + e)
    return ForwardBatch(
        mode=ForwardMode.DECODE if decode else ForwardMode.PREFILL,
        requests=[None] * len(cases),
        input_ids=[0] * len(loc),  # type: ignore[list-item]
        positions=pos,
        out_cache_loc=loc,
        seq_lens=[p + e for p, e in cases],
        extend_lens=[e for _, e in cases],
        prefix_lens=[p for p, _ in cases],
        req_pages=pages,
        page_size=pool.page_size,
    )


SHAPES = {  # (windows of layers 0 and 1, soft cap): Mistral-like, Gemma-2-like, a capped model without windows
    "window": ((16, 16), None),
    "local-global-capped": ((16, None), 50.0),
    "capped": ((None, None), 30.0),
}


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("kernel", ["flashinfer", "auto"])
@pytest.mark.parametrize("shape_case", SHAPES)
def test_flashinfer_windows_and_soft_cap_match_torch_native(page_size, kernel, shape_case):
    pytest.importorskip("flashinfer")
    from graphtop.engine.attention.flashinfer_backend import FlashInferBackend

    windows, cap = SHAPES[shape_case]
    hq, hkv = 16, 4
    shape = AttentionShape(hq, hkv, D, D**-0.5, windows, cap)
    decode_cases = [(n - 1, 1) for n in CTX]
    extend_cases = [(0, 40), (31, 1), (15, 40), (1000, 100), (0, 13)]
    pages = sum(-(-(p + e) // page_size) for p, e in decode_cases + extend_cases)
    pool = _pool(page_size, pages + 8, hkv)
    ref = TorchNativeBackend(pool, shape, torch.device("cuda"))
    fib = FlashInferBackend(pool, shape, torch.device("cuda"), decode_kernel=kernel)
    rng = random.Random(page_size)
    for decode, cases in ((True, decode_cases), (False, extend_cases)):
        batch = _batch(pool, cases, rng, decode)
        n = batch.num_tokens
        for layer in (0, 1):
            q, k, v = _rand(n, hq, D, seed=1 + layer), _rand(n, hkv, D, seed=3), _rand(n, hkv, D, seed=5)
            with torch.inference_mode():
                ref.prepare(batch)
                want = ref.forward(q, k, v, layer)
                fib.prepare(batch)
                got = fib.forward(q, k, v, layer)
            assert _rel(got, want) <= REL_TOL, f"{'decode' if decode else 'extend'} layer {layer}"


def test_the_triton_decode_kernel_is_refused_for_a_soft_cap():
    pytest.importorskip("flashinfer")
    from graphtop.engine.attention.base import AttentionBackendError
    from graphtop.engine.attention.flashinfer_backend import FlashInferBackend

    pool = _pool(16, 8, 4)
    shape = AttentionShape(16, 4, D, D**-0.5, (16, None), 50.0)
    with pytest.raises(AttentionBackendError, match="no attention logit soft cap"):
        FlashInferBackend(pool, shape, torch.device("cuda"), decode_kernel="triton")
    assert FlashInferBackend(pool, shape, torch.device("cuda")).triton_max_rows == 0  # auto: FlashInfer's own


@pytest.mark.parametrize("kernel", ["flashinfer", "triton"])
def test_a_windowed_decode_graph_replays_live_windows(kernel):
    """One captured bucket, replayed on batches whose rows sit on both sides of the window: the window is
    the page lists' (each row's length), nothing of it fixed at capture."""
    pytest.importorskip("flashinfer")
    from graphtop.engine.attention.flashinfer_backend import FlashInferBackend

    hq, hkv, bucket, page_size = 16, 4, 8, 16
    shape = AttentionShape(hq, hkv, D, D**-0.5, (16, None))
    batches = [[1, 17, 300, 1000, 33], [5, 6, 7, 8, 9, 10, 11, 12], [2049], [15, 16, 17, 64]]
    pool = _pool(page_size, sum(-(-n // page_size) for ctx in batches for n in ctx) + 8, hkv)
    ref = TorchNativeBackend(pool, shape, torch.device("cuda"))
    fib = FlashInferBackend(pool, shape, torch.device("cuda"), decode_kernel=kernel)
    fib.init_graph_state(bucket, pool.pages_for(4096))
    registry = BufferRegistry(torch.device("cuda"), bucket)
    for slot in fib.graph_buffer_slots():
        registry.declare(slot)
    qs = torch.zeros(bucket, hq, D, dtype=DTYPE, device="cuda")
    ks, vs = (torch.zeros(bucket, hkv, D, dtype=DTYPE, device="cuda") for _ in range(2))

    def step() -> torch.Tensor:
        fib.prepare_in_graph()
        return torch.stack([fib.forward(qs, ks, vs, layer) for layer in (0, 1)])

    rng = random.Random(3)
    with torch.inference_mode():
        registry.reset()
        fib.bind_graph_meta(registry, bucket)
        fib.prepare_capture(bucket)
        step()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = step()
        for i, ctx in enumerate(batches):
            bs = len(ctx)
            batch = _batch(pool, [(n - 1, 1) for n in ctx], rng, decode=True)
            qs.copy_(_rand(bucket, hq, D, seed=10 + i))
            ks.copy_(_rand(bucket, hkv, D, seed=20 + i))
            vs.copy_(_rand(bucket, hkv, D, seed=30 + i))
            registry.fill(batch, bucket)
            fib.bind_graph_meta(registry, bucket)
            fib.prepare_replay(batch, bucket)
            graph.replay()
            got = static_out[:, :bs].clone()
            ref.prepare(batch)
            for layer in (0, 1):
                want = ref.forward(qs[:bs], ks[:bs], vs[:bs], layer)
                assert _rel(got[layer], want) <= REL_TOL, f"batch {ctx}, layer {layer}"


# --- whole engines ---------------------------------------------------------------------------------------
CASES = {
    "mistral-window": ("mistral", {"sliding_window": 16}),
    "qwen2-window": ("qwen2", {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1}),
    "gemma2": ("gemma2", {}),
    "gemma3": ("gemma3", {}),
    "phi3-window": ("phi3", {"sliding_window": 16}),
    "phi3-partial-rotary": ("phi3", {"partial_rotary_factor": 0.5}),
}
# head_dim 128: the shape FlashInfer's prebuilt kernels cover
WIDE = dict(hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=128, intermediate_size=512, num_layers=2)


def _config(attention: str, graphs: bool, dtype: str = "bfloat16"):
    from graphtop.engine.config import EngineConfig
    from graphtop.engine.graphs.config import GraphConfig

    g = GraphConfig()
    if not graphs:
        g.set("decode.backend", "disabled")
        g.set("prefill.backend", "disabled")
    return EngineConfig(
        device="cuda",
        dtype=dtype,
        attention_backend=attention,
        page_size=16,
        max_total_tokens=8192,
        chunked_prefill_size=16,
        graphs=g,
        capture_before_serving=True,
    )


@pytest.mark.parametrize("case", CASES)
def test_fp32_greedy_tokens_equal_transformers_on_cuda(tmp_path, case):
    """torch-native attention and real CUDA graphs, fp32: transformers' greedy tokens, 64+ past the window."""
    from support.tiny_models import build_tiny_checkpoint, shared_tokenizer
    from transformers import AutoModelForCausalLM

    from graphtop.engine.engine import Engine
    from graphtop.engine.sampling_params import SamplingParams

    family, overrides = CASES[case]
    path = build_tiny_checkpoint(tmp_path, family, **overrides)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()
    prompt = "In a hole in the ground there lived a hobbit, not a nasty one"
    eng = Engine.from_pretrained(path, config=_config("torch", graphs=True, dtype="float32"))
    try:
        got = eng.generate([prompt], SamplingParams(max_new_tokens=90, ignore_eos=True))[0].token_ids
    finally:
        eng.close()
    ids = torch.tensor([shared_tokenizer().encode(prompt)], device="cuda")
    want = hf.generate(ids, max_new_tokens=90, min_new_tokens=90, do_sample=False, attention_mask=torch.ones_like(ids))
    assert got == want[0, ids.shape[1] :].tolist()


@pytest.mark.parametrize("case", CASES)
def test_flashinfer_graphs_match_torch_native_eager(tmp_path, monkeypatch, case):
    """bf16, the fused kernels where the family takes them: FlashInfer with graphs vs torch-native eager,
    teacher-forced (support/token_agreement.py)."""
    pytest.importorskip("flashinfer")
    from support.tiny_models import build_tiny_checkpoint

    from graphtop.engine.engine import Engine

    family, overrides = CASES[case]
    path = build_tiny_checkpoint(tmp_path, family, **{**WIDE, **overrides})
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 500, (n,), generator=gen).tolist() for n in (5, 40, 120, 17)]
    max_new = [80, 70, 40, 60]
    ref_engine = Engine.from_pretrained(path, config=_config("torch", graphs=False))
    ref = Recorder()
    try:
        serve(ref_engine, prompts, max_new, ref, monkeypatch)
    finally:
        ref_engine.close()
    engine = Engine.from_pretrained(path, config=_config("flashinfer", graphs=True))
    got = Recorder(ref)
    try:
        assert engine.info.attention_backend.startswith("flashinfer"), engine.info.attention_backend
        serve(engine, prompts, max_new, got, monkeypatch)
    finally:
        engine.close()
    _assert_agree(ref, got, f"{case}: flashinfer graphs vs torch-native eager", logits_tol=3e-2)
