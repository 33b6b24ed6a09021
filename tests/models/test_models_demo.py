"""The demo checkpoint: built once, atomically, deterministically, and loadable."""

from __future__ import annotations

import hashlib
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from graphtop.models import DEMO_NOTE, ensure_demo_model, load_checkpoint
from graphtop.models.layers.reference_attention import ContiguousAttention
from graphtop.models.synthetic import demo


def digests(folder):
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(folder.iterdir())}


def test_demo_build_is_cached_deterministic_and_loads(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHTOP_CACHE_DIR", str(tmp_path / "env-cache"))
    first = ensure_demo_model()
    assert first == tmp_path / "env-cache" / "demo-qwen3-v1"
    assert [p.name for p in first.parent.iterdir()] == ["demo-qwen3-v1"]  # no staging leftovers

    def no_rebuild(folder):
        raise AssertionError("cache hit expected")

    monkeypatch.setattr(demo, "_build", no_rebuild)
    assert ensure_demo_model() == first
    monkeypatch.undo()

    second = ensure_demo_model(tmp_path / "other")
    assert second != first and digests(second) == digests(first)
    assert {"model.safetensors", "tokenizer.json", "config.json"} <= set(digests(first))

    loaded = load_checkpoint(first)
    spec = loaded.spec
    assert spec.architecture == "Qwen3ForCausalLM" and spec.qk_norm
    assert spec.head_dim * spec.num_heads != spec.hidden_size and spec.num_kv_heads < spec.num_heads
    assert spec.vocab_size == len(loaded.tokenizer) and loaded.dtype == torch.bfloat16
    assert loaded.tokenizer.eos_token == "<|endoftext|>" and loaded.tokenizer.eos_token_id in spec.eos_token_ids
    prompt = loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    ids = torch.tensor(loaded.tokenizer(prompt).input_ids)
    with torch.no_grad():
        logits = loaded.model.compute_logits(loaded.model(ids, torch.arange(len(ids)), ContiguousAttention()))
    assert logits.shape == (len(ids), spec.vocab_size) and torch.isfinite(logits).all()
    assert "gibberish" in DEMO_NOTE


def test_failed_build_leaves_nothing(tmp_path, monkeypatch):
    def explode(folder):
        (folder / "config.json").write_text("{}")
        raise RuntimeError("killed mid-build")

    monkeypatch.setattr(demo, "_build", explode)
    with pytest.raises(RuntimeError):
        ensure_demo_model(tmp_path)
    assert list(tmp_path.iterdir()) == []
