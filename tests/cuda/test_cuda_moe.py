"""The grouped expert GEMM on CUDA (``-m cuda``): against the sorted torch path in bf16, fp16 and fp32, with no
host sync, captured in a CUDA graph that replays for any routing; and whole Qwen3-MoE and Mixtral engines
(real decode and prefill graphs) against transformers (fp32) and against torch-native eager (bf16)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import torch.nn.functional as F
from support.token_agreement import Recorder, _assert_agree, serve

from graphtop.models.kernels.fused_moe import grouped_experts
from graphtop.models.layers.moe_routing import Routing, route
from graphtop.models.layers.moe_torch import sorted_experts

TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 5e-3}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-6)).item()


def _experts(e: int, h: int, i: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    w13 = torch.randn(e, 2 * i, h, generator=gen, device="cuda") / h**0.5
    w2 = torch.randn(e, h, i, generator=gen, device="cuda") / i**0.5
    router = torch.randn(e, h, generator=gen, device="cuda")
    return w13.to(dtype), w2.to(dtype), router.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("tokens", [1, 3, 8, 64, 300])
@pytest.mark.parametrize("shape", [(8, 2, 256, 128), (64, 8, 256, 96)])  # E, k, H, I (96: K not a whole tile)
def test_grouped_gemm_equals_the_sorted_path(dtype, tokens, shape):
    e, k, h, i = shape
    w13, w2, router = _experts(e, h, i, dtype, seed=tokens)
    x = torch.randn(tokens, h, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1)).to(dtype)
    weights, ids = route(x @ router.T, Routing(k, True, dtype == torch.float32))
    with torch.inference_mode():
        got = grouped_experts(x, w13, w2, weights, ids, F.silu)
        want = sorted_experts(x.float(), w13.float(), w2.float(), weights.float(), ids, F.silu)
    assert got.dtype == dtype and got.shape == (tokens, h)
    assert _rel(got, want) <= TOL[dtype], f"{dtype} T={tokens} {shape}"


def test_the_grouped_gemm_syncs_nothing_with_the_host():
    w13, w2, router = _experts(64, 256, 128, torch.bfloat16)
    x = torch.randn(16, 256, device="cuda", dtype=torch.bfloat16)
    weights, ids = route(x @ router.T, Routing(8, True, False))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.inference_mode():
            grouped_experts(x, w13, w2, weights, ids, F.silu)
            route(x @ router.T, Routing(8, True, False))
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("tokens", [1, 8, 48])
def test_a_captured_graph_replays_for_any_routing(tokens):
    """Captured once per batch size (a decode bucket), replayed on inputs that route elsewhere: spread over
    every expert, or every token to the same k experts (the most padding one expert can need)."""
    e, k, h, i = 32, 4, 256, 128
    w13, w2, router = _experts(e, h, i, torch.bfloat16)
    rule = Routing(k, True, False)
    with torch.inference_mode():
        x = torch.randn(tokens, h, device="cuda", dtype=torch.bfloat16)

        def step() -> torch.Tensor:
            weights, ids = route(x @ router.T, rule)
            return grouped_experts(x, w13, w2, weights, ids, F.silu)

        for _ in range(2):  # compile and warm up outside the capture
            step()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()
        skewed = torch.randn(1, h, device="cuda", dtype=torch.bfloat16).expand(tokens, h) * 3
        for fresh in (torch.randn(tokens, h, device="cuda", dtype=torch.bfloat16), skewed):
            x.copy_(fresh)
            graph.replay()
            torch.cuda.synchronize()
            weights, ids = route(x @ router.T, rule)
            want = sorted_experts(x.float(), w13.float(), w2.float(), weights.float(), ids, F.silu)
            assert _rel(out, want) <= TOL[torch.bfloat16]


# --- whole engines ---------------------------------------------------------------------------------------
CASES = {
    "qwen3-moe": ("qwen3_moe", {}),
    "qwen3-moe-unnormalised-dense-layer": ("qwen3_moe", {"norm_topk_prob": False, "mlp_only_layers": [1]}),
    "mixtral-window": ("mixtral", {"sliding_window": 16}),
}
# head_dim 128 (FlashInfer's prebuilt kernels), 16 experts of 128 features, 4 a token
WIDE = {
    "qwen3_moe": dict(hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=128, moe_intermediate_size=128),
    "mixtral": dict(hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=128, intermediate_size=128),
}
EXPERTS = {"qwen3_moe": dict(num_experts=16, num_experts_per_tok=4), "mixtral": dict(num_local_experts=16)}


def _config(attention: str, graphs: bool, dtype: str):
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
def test_fp32_greedy_tokens_equal_transformers_with_cuda_graphs(tmp_path, case):
    """The grouped GEMM at full fp32 precision inside real decode and prefill graphs: transformers' greedy
    tokens for 90 tokens (past Mixtral's window)."""
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


@pytest.mark.parametrize("attention", ["torch", "flashinfer"])
@pytest.mark.parametrize("case", CASES)
def test_bf16_graphs_match_eager(tmp_path, monkeypatch, case, attention):
    """bf16: decode and prefill graphs (the grouped GEMM captured at every bucket) vs torch-native eager,
    teacher-forced (support/token_agreement.py)."""
    if attention == "flashinfer":
        pytest.importorskip("flashinfer")
    from support.tiny_models import build_tiny_checkpoint

    from graphtop.engine.engine import Engine

    family, overrides = CASES[case]
    path = build_tiny_checkpoint(tmp_path, family, **{**WIDE[family], **EXPERTS[family], **overrides})
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 500, (n,), generator=gen).tolist() for n in (5, 40, 120, 17)]
    max_new = [80, 70, 40, 60]
    ref_engine = Engine.from_pretrained(path, config=_config("torch", graphs=False, dtype="bfloat16"))
    ref = Recorder()
    try:
        serve(ref_engine, prompts, max_new, ref, monkeypatch)
    finally:
        ref_engine.close()
    engine = Engine.from_pretrained(path, config=_config(attention, graphs=True, dtype="bfloat16"))
    got = Recorder(ref)
    try:
        serve(engine, prompts, max_new, got, monkeypatch)
    finally:
        engine.close()
    _assert_agree(ref, got, f"{case}: {attention} graphs vs torch-native eager", logits_tol=3e-2)
