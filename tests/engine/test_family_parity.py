"""The families beyond Llama through the whole engine on CPU (paged KV, chunked prefill, torch-native
attention, eager and emulated decode graphs) against transformers on tiny random fp32 checkpoints: the
logits of every sampled position (a prompt's last, then each decode step) equal transformers' forward over
the same tokens, and greedy tokens equal ``generate``, for prompts longer than the sliding window and 80
tokens past it."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from support.tiny_models import shared_tokenizer
from support.token_agreement import Recorder, serve

from graphtop.engine.telemetry.bus import EventBus

pytestmark = pytest.mark.usefixtures("torch_one_thread")

WINDOW = 16
LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0 + 0.25 * i for i in range(4)],
    "long_factor": [3.0 + 0.5 * i for i in range(4)],
}
CASES = {
    "mistral-window": ("mistral", {"sliding_window": WINDOW}),
    "qwen2-window-upper-layer": (
        "qwen2",
        {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1},
    ),
    "gemma2": ("gemma2", {}),
    "gemma3": ("gemma3", {}),
    "phi3-window": ("phi3", {"sliding_window": WINDOW}),
    # rotates half of each head, LongRoPE's short factors with the attention factor of a 2x context extension
    "qwen3-moe": ("qwen3_moe", {}),
    "mixtral-window": ("mixtral", {"sliding_window": WINDOW}),
    "phi3-partial-longrope": (
        "phi3",
        {"partial_rotary_factor": 0.5, "rope_scaling": LONGROPE, "original_max_position_embeddings": 128},
    ),
}
PROMPTS = [
    "In a hole in the ground there lived a hobbit, not a nasty one",
    "The quick brown fox jumps over the lazy dog, twice",
    "Once",
]
MAX_NEW = [80, 70, 30]
MODES = {"eager-ps1": (False, 1), "graphs-ps1": (True, 1), "graphs-ps16": (True, 16)}


@pytest.fixture(scope="module")
def reference(tiny_ckpt):
    """Per case: (checkpoint, transformers' greedy tokens per prompt, its logits over prompt + tokens)."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    cache = {}

    def get(case):
        if case in cache:
            return cache[case]
        family, overrides = CASES[case]
        path = tiny_ckpt(family, **overrides)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        tok = shared_tokenizer()
        tokens, logits = [], []
        with torch.no_grad():
            for prompt, max_new in zip(PROMPTS, MAX_NEW):
                ids = torch.tensor([tok.encode(prompt)])
                gen = GenerationConfig(max_new_tokens=max_new, do_sample=False, num_beams=1, min_length=max_new)
                seq = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gen, pad_token_id=0)
                tokens.append(seq[0, ids.shape[1] :].tolist())
                logits.append(model(seq).logits[0, ids.shape[1] - 1 : -1])
        cache[case] = path, tokens, logits
        return cache[case]

    return get


def test_prompts_outgrow_the_window():
    lengths = [len(shared_tokenizer().encode(p)) for p in PROMPTS]
    assert max(lengths) > WINDOW and min(lengths) < WINDOW
    assert all(n + m < 128 for n, m in zip(lengths, MAX_NEW))  # inside phi3-partial-longrope's short context
    assert max(n + m for n, m in zip(lengths, MAX_NEW)) >= WINDOW + 64 + max(lengths) // 2


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES)
def test_logits_and_greedy_tokens_equal_transformers(reference, make_engine, monkeypatch, case, mode):
    path, want_tokens, want_logits = reference(case)
    graphs, page_size = MODES[mode]
    bus = EventBus()
    steps = bus.subscribe("steps", types=["step"])
    engine = make_engine(path, bus=bus, graphs=None if graphs else False, page_size=page_size, chunked_prefill_size=16)
    tok = shared_tokenizer()
    recorder = Recorder()
    serve(engine, [tok.encode(p) for p in PROMPTS], MAX_NEW, recorder, monkeypatch)
    paths = {(e.phase, e.path) for e in steps.drain()}
    assert ("decode", "graph" if graphs else "eager") in paths
    for i, (tokens, logits) in enumerate(zip(want_tokens, want_logits)):
        got = torch.stack(recorder.rows[f"r{i}"])
        torch.testing.assert_close(got, logits, atol=2e-4, rtol=1e-4, msg=lambda m: f"prompt {i}: {m}")
        assert recorder.preds[f"r{i}"] == tokens, f"prompt {i}"
