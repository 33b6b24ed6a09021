"""Greedy parity with transformers: the whole engine (paged KV, continuous batching, chunked prefill,
emulated graphs) must produce exactly the tokens of HF ``generate`` on tiny random fp32 models."""

from __future__ import annotations

import json
import os
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from support.tiny_models import shared_tokenizer

from graphtop.engine.request import FinishReason
from graphtop.engine.sampling_params import SamplingParams
from graphtop.engine.telemetry.bus import EventBus

pytestmark = pytest.mark.usefixtures("torch_one_thread")

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
# (family, overrides): GQA/MQA, tied/untied, qkv bias, q/k norm with head_dim != hidden/heads, llama3 rope.
CASES = {
    "llama-gqa-untied": ("llama", {}),
    "llama-mqa-tied": ("llama", {"num_kv_heads": 1, "tie_word_embeddings": True}),
    "llama3-rope-scaling": ("llama", {"rope_scaling": LLAMA3}),
    "mistral-gqa": ("mistral", {}),
    "qwen2-qkv-bias-mqa": ("qwen2", {"num_kv_heads": 1}),
    "qwen2-qkv-bias-tied": ("qwen2", {"tie_word_embeddings": True}),
    "qwen3-qk-norm-head-dim-32": ("qwen3", {}),
}
PROMPTS = [
    "Once",
    "The quick brown fox jumps over the lazy dog",
    "Graphs are a fast path, never the only path: a batch a graph cannot take runs",
    "In a hole in the ground there lived a hobbit. Not a nasty, dirty, wet hole, filled with the ends "
    "of worms and an oozy smell, nor yet a dry, bare, sandy hole",
]
CHUNK = 16
MAX_NEW = [24, 21, 23, 20]  # per prompt: requests finish one by one, so decode batches shrink and get padded
# (graphs, page_size): pure eager, and the default emulated graphs at two page sizes
MODES = {"eager-ps1": (False, 1), "graphs-ps1": (True, 1), "graphs-ps16": (True, 16)}


def test_prompts_cover_chunking():
    lengths = [len(shared_tokenizer().encode(p)) for p in PROMPTS]
    assert len(set(lengths)) == len(PROMPTS)
    assert max(lengths) > 2 * CHUNK  # the longest prompt is prefilled in 3+ chunks
    assert max(lengths) + max(MAX_NEW) < 256  # and everything stays inside the tiny models' context


def hf_greedy(path, prompts, eos_ids, max_new_tokens=MAX_NEW):
    """transformers' greedy generate, one prompt at a time (no padding), stopping at `eos_ids`;
    ``max_new_tokens`` is per prompt."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = shared_tokenizer()
    out = []
    with torch.no_grad():
        for prompt, max_new in zip(prompts, max_new_tokens):
            gen = GenerationConfig(
                max_new_tokens=max_new,
                do_sample=False,
                num_beams=1,
                min_length=0,
                eos_token_id=list(eos_ids),
                pad_token_id=tok.eos_token_id,
            )
            ids = torch.tensor([tok.encode(prompt)])
            seq = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gen)
            out.append(seq[0, ids.shape[1] :].tolist())
    return out


@pytest.fixture(scope="module")
def reference(tiny_ckpt):
    """Per case: (checkpoint path, HF greedy tokens), computed once for all modes."""
    cache = {}

    def get(case):
        if case not in cache:
            family, overrides = CASES[case]
            path = tiny_ckpt(family, **overrides)
            eos = (shared_tokenizer().eos_token_id,)
            cache[case] = path, hf_greedy(path, PROMPTS, eos)
        return cache[case]

    return get


def serve_together(make_engine, path, mode, prompts=PROMPTS):
    graphs, page_size = MODES[mode]
    bus = EventBus()
    steps = bus.subscribe("steps", types=["step"])
    engine = make_engine(
        path, bus=bus, graphs=None if graphs else False, page_size=page_size, chunked_prefill_size=CHUNK
    )
    handles = [engine.submit(p, SamplingParams(max_new_tokens=m)) for p, m in zip(prompts, MAX_NEW)]
    engine.run_until_idle()  # all submitted before the first step: one continuous batch
    events = steps.drain()
    assert engine.pool.used_pages == 0
    if graphs:  # the comparison is only meaningful if both graph phases actually replayed
        assert {(e.phase, e.path) for e in events} >= {("prefill", "graph"), ("decode", "graph")}
        assert any(e.padded for e in events if e.phase == "decode" and e.path == "graph")
    else:
        assert {e.path for e in events} == {"eager"}
        assert {e.fallback_reason for e in events} == {"phase_disabled"}
    return engine, handles


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES)
def test_greedy_tokens_equal_transformers(reference, make_engine, case, mode):
    path, want = reference(case)
    engine, handles = serve_together(make_engine, path, mode)
    assert engine.info.page_size == MODES[mode][1]
    got = [h.token_ids for h in handles]
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"prompt {i} ({len(handles[i].prompt_ids)} tokens) diverges at {_first_diff(g, w)}"
    for h, w, m in zip(handles, want, MAX_NEW):
        expected = FinishReason.LENGTH if len(w) == m and w[-1] not in engine.spec.eos_token_ids else FinishReason.EOS
        assert h.finish_reason is expected


@pytest.fixture(scope="module")
def eos_checkpoint(tiny_ckpt, tmp_path_factory):
    """The llama checkpoint plus a generation_config.json naming a token greedy decoding really emits
    as a second EOS: both engines must stop on it, include it, and agree on where."""
    base = tiny_ckpt("llama")
    free_run = hf_greedy(base, PROMPTS, eos_ids=(shared_tokenizer().eos_token_id,))
    stop_token = free_run[3][10]
    folder = tmp_path_factory.mktemp("eos") / "llama-eos"
    shutil.copytree(base, folder)
    eos_ids = [shared_tokenizer().eos_token_id, stop_token]
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_ids}))
    return folder, eos_ids, free_run


@pytest.mark.parametrize("mode", ["eager-ps1", "graphs-ps1"])
def test_eos_handling_equals_transformers(eos_checkpoint, make_engine, mode):
    folder, eos_ids, free_run = eos_checkpoint
    want = hf_greedy(folder, PROMPTS, eos_ids)
    engine, handles = serve_together(make_engine, folder, mode)
    assert set(eos_ids) <= set(engine.spec.eos_token_ids)
    assert [h.token_ids for h in handles] == want
    stopped = [h for h in handles if h.finish_reason is FinishReason.EOS]
    assert stopped, "the second EOS token never came up; the test would not exercise EOS"
    for h, full in zip(handles, free_run):
        if h.finish_reason is FinishReason.EOS:
            assert h.token_ids[-1] in eos_ids  # the EOS token is part of the output, like HF
            assert h.token_ids == full[: len(h.token_ids)]  # and nothing before it changed
            assert len(h.token_ids) < len(full)


def _first_diff(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
