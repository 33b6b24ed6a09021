"""Gemma 2, Gemma 3, Phi-3 and the sliding windows of Mistral and Qwen2 against transformers on tiny
random fp32 checkpoints: logits of every position of a prompt longer than the window, prefill and decode one
token at a time; and what each family reads from its config and its checkpoint."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from support.tiny_models import build_tiny_checkpoint

from graphtop.models import load_checkpoint
from graphtop.models.layers.reference_attention import ContiguousAttention
from graphtop.models.layers.rope import RotaryEmbedding

LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0 + 0.25 * i for i in range(8)],
    "long_factor": [3.0 + 0.5 * i for i in range(8)],
}
CASES = {
    "mistral-window": ("mistral", {"sliding_window": 16}),
    "qwen2-window-upper-layer": ("qwen2", {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1}),
    "gemma2": ("gemma2", {}),
    "gemma2-untied-mqa": ("gemma2", {"tie_word_embeddings": False, "num_kv_heads": 1}),
    "gemma3": ("gemma3", {}),
    "gemma3-linear-global-rope-capped": (
        "gemma3",
        {"rope_scaling": {"rope_type": "linear", "factor": 4.0}, "final_logit_softcapping": 20.0},
    ),
    "phi3": ("phi3", {}),
    "phi3-window-tied": ("phi3", {"sliding_window": 16, "tie_word_embeddings": True}),
    "phi3-partial-rotary": ("phi3", {"partial_rotary_factor": 0.5}),
    "phi3-longrope": ("phi3", {"rope_scaling": LONGROPE, "original_max_position_embeddings": 128}),
}
LENGTHS = (1, 9, 16, 17, 50, 100)


def hf_model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def forward(model, ids, attn, start=0):
    with torch.no_grad():
        return model.compute_logits(model(ids, torch.arange(start, start + len(ids)), attn))


@pytest.mark.parametrize("case", CASES)
def test_logits_match_transformers_prefill_and_decode(tmp_path, case):
    family, overrides = CASES[case]
    path = build_tiny_checkpoint(tmp_path, family, **overrides)
    loaded = load_checkpoint(path)
    model, spec = loaded.model, loaded.spec
    ids = torch.randint(0, spec.vocab_size, (max(LENGTHS),), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf_model(path)(ids[None]).logits[0]
    for n in LENGTHS:
        got = forward(model, ids[:n], ContiguousAttention.for_spec(spec))
        torch.testing.assert_close(got, want[:n], atol=1e-4, rtol=1e-4)
    attn = ContiguousAttention.for_spec(spec)
    rows = [forward(model, ids[:20], attn)[-1]]  # prefill past the window, then a token at a time
    rows += [forward(model, ids[p : p + 1], attn, start=p)[0] for p in range(20, max(LENGTHS))]
    torch.testing.assert_close(torch.stack(rows), want[19:], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("case", ["mistral-window", "qwen2-window-upper-layer", "gemma2", "gemma3"])
def test_the_window_masks_what_lies_before_it(tmp_path, case):
    """Not a vacuous window: attending to the whole context instead changes the logits from the first
    position whose context outgrows the window on, and none before it."""
    family, overrides = CASES[case]
    loaded = load_checkpoint(build_tiny_checkpoint(tmp_path, family, **overrides))
    spec = loaded.spec
    ids = torch.randint(0, spec.vocab_size, (40,), generator=torch.Generator().manual_seed(2))
    windowed = forward(loaded.model, ids, ContiguousAttention.for_spec(spec))
    whole = forward(loaded.model, ids, ContiguousAttention(spec.softmax_scale, (), spec.attn_softcap))
    w = spec.sliding_window
    assert torch.equal(windowed[:w], whole[:w])
    assert (windowed[w:] - whole[w:]).abs().amax(-1).min() > 1e-3


def test_what_each_family_reads(tmp_path):
    gemma2 = load_checkpoint(build_tiny_checkpoint(tmp_path / "g2", "gemma2")).spec
    assert (gemma2.hidden_act, gemma2.head_dim, gemma2.softmax_scale) == ("gelu_pytorch_tanh", 32, 24**-0.5)
    assert (gemma2.attn_softcap, gemma2.final_softcap, gemma2.embed_scale) == (50.0, 30.0, 8.0)
    assert gemma2.layer_windows() == (16, None) and gemma2.local_rope_theta is None
    gemma3 = load_checkpoint(build_tiny_checkpoint(tmp_path / "g3", "gemma3")).spec
    assert gemma3.qk_norm and gemma3.attn_softcap is None and gemma3.final_softcap is None
    assert (gemma3.local_rope_theta, gemma3.local_rope(0), gemma3.local_rope(1)) == (100.0, True, False)
    phi = load_checkpoint(build_tiny_checkpoint(tmp_path / "p", "phi3", partial_rotary_factor=0.5)).spec
    assert (phi.rotary_dim, phi.head_dim, phi.layer_windows()) == (8, 16, (None, None))


def test_phi3_reads_q_k_v_and_gate_up_from_the_stacked_tensors(tmp_path):
    from safetensors.torch import load_file

    path = build_tiny_checkpoint(tmp_path, "phi3", num_kv_heads=1)
    stored = load_file(path / "model.safetensors")
    assert "model.layers.0.self_attn.qkv_proj.weight" in stored and "model.layers.0.mlp.gate_up_proj.weight" in stored
    layer = load_checkpoint(path).model.model.layers[1]
    qkv, gate_up = stored["model.layers.1.self_attn.qkv_proj.weight"], stored["model.layers.1.mlp.gate_up_proj.weight"]
    attn, mlp = layer.self_attn, layer.mlp
    assert torch.equal(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]), qkv)
    assert attn.k_proj.weight.shape[0] == 16  # one KV head of 16
    assert torch.equal(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), gate_up)


def test_phi3_with_a_missing_stacked_tensor_names_it(tmp_path):
    from safetensors.torch import load_file, save_file

    from graphtop.models import CheckpointError

    path = build_tiny_checkpoint(tmp_path, "phi3")
    tensors = load_file(path / "model.safetensors")
    tensors["model.layers.1.mlp.gate_up_proj.weight"] = tensors["model.layers.1.mlp.gate_up_proj.weight"][:100]
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"'model.layers.1.mlp.gate_up_proj.weight' has shape \[100, 64\]"):
        load_checkpoint(path)


def test_longrope_rotates_short_then_long_like_transformers(tmp_path):
    """Inside the pretraining context the table is transformers' short one; from it on, its long one (which
    transformers takes for a whole sequence once it is that long)."""
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    path = build_tiny_checkpoint(tmp_path, "phi3", rope_scaling=LONGROPE, original_max_position_embeddings=64)
    spec = load_checkpoint(path).spec
    config = hf_model(path).config
    ours = RotaryEmbedding(spec).cos_sin_cache
    hf = Phi3RotaryEmbedding(config)
    half = spec.rotary_dim // 2
    for positions in (torch.arange(0, 64), torch.arange(64, 256)):  # a sequence inside, one past the context
        cos, sin = hf(torch.zeros(1), positions[None])
        assert torch.equal(ours[positions, :half], cos[0, :, :half]) and torch.equal(
            ours[positions, half:], sin[0, :, :half]
        )


def test_gemma3_refuses_bidirectional_attention(tmp_path):
    from graphtop.models import CheckpointError

    path = build_tiny_checkpoint(tmp_path, "gemma3")
    config = json.loads((path / "config.json").read_text())
    config["use_bidirectional_attention"] = True
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="use_bidirectional_attention is not supported"):
        load_checkpoint(path)


@pytest.mark.parametrize(
    "family, overrides, reason",
    [
        ("gemma2", {}, "its layers (SandwichLayer, OffsetRMSNorm) are not the pre-norm RMSNorm block"),
        ("phi3", {"partial_rotary_factor": 0.5}, "partial rotary (RoPE over 8 of 16 dimensions)"),
        ("phi3", {"sliding_window": 16}, None),  # windows are the attention backend's: fused as Llama
    ],
)
def test_which_families_the_fused_kernels_run(tmp_path, family, overrides, reason):
    model = load_checkpoint(build_tiny_checkpoint(tmp_path, family, **overrides)).model
    assert model.fused_kernels_problem() == reason


def test_a_random_phi3_checkpoint_stores_the_stacked_layout(tmp_path, monkeypatch):
    """save_random_checkpoint writes a family's own layout (Phi-3's stacked tensors), which transformers and
    graphtop both load to the same logits."""
    from graphtop.models.synthetic import random_model

    tiny = dict(
        model_type="phi3",
        architectures=["Phi3ForCausalLM"],
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=300,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        eos_token_id=2,
        bos_token_id=1,
        pad_token_id=0,
    )
    monkeypatch.setitem(random_model.SHAPES, "tiny-phi3", tiny)
    path = random_model.save_random_checkpoint("tiny-phi3", tmp_path / "rand", dtype=torch.float32, std=0.2)
    index = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    assert "model.layers.0.self_attn.qkv_proj.weight" in index and "model.layers.0.self_attn.q_proj.weight" not in index
    loaded = load_checkpoint(path)
    ids = torch.arange(30) * 7 % 300
    with torch.no_grad():
        want = hf_model(path)(ids[None]).logits[0]
    torch.testing.assert_close(
        forward(loaded.model, ids, ContiguousAttention.for_spec(loaded.spec)), want, atol=1e-4, rtol=1e-4
    )
