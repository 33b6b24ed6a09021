"""Our decoder vs transformers on tiny real checkpoints of every family and variant (fp32)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from support.tiny_models import build_tiny_checkpoint, reshard

from graphtop.models import DecoderForCausalLM, ModelSpec, load_checkpoint
from graphtop.models.layers.reference_attention import ContiguousAttention

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
LINEAR = {"rope_type": "linear", "factor": 4.0}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
YARN_MSCALE = {**YARN, "mscale": 0.707, "mscale_all_dim": 1.0, "beta_fast": 16.0, "truncate": False}

CASES = {
    "llama-gqa": ("llama", {}),
    "llama-mqa": ("llama", {"num_kv_heads": 1}),
    "llama-mha-tied": ("llama", {"num_kv_heads": 4, "tie_word_embeddings": True}),
    "llama-biases": ("llama", {"attention_bias": True, "mlp_bias": True}),
    "llama-rope-llama3": ("llama", {"rope_scaling": LLAMA3}),
    "llama-rope-linear": ("llama", {"rope_scaling": LINEAR}),
    "mistral": ("mistral", {}),
    "mistral-head-dim": ("mistral", {"head_dim": 32}),
    "qwen2-qkv-bias": ("qwen2", {}),
    "qwen2-tied-mqa": ("qwen2", {"tie_word_embeddings": True, "num_kv_heads": 1}),
    "qwen2-rope-yarn": ("qwen2", {"rope_scaling": YARN}),
    "qwen3-qk-norm": ("qwen3", {}),
    "qwen3-bias-tied": ("qwen3", {"attention_bias": True, "tie_word_embeddings": True}),
    "qwen3-rope-yarn-mscale": ("qwen3", {"rope_scaling": YARN_MSCALE}),
}
LENGTHS = (1, 9, 50, 120)  # 120 > original_max_position_embeddings of the scaled ropes


def hf_model(path, dtype=torch.float32, **kwargs):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs).eval()


def eager_attention(q, k, v, layer_id):
    """Single-sequence causal attention with exactly HF's `eager_attention_forward` ops."""
    n, heads, dim = q.shape
    q, k, v = (t.repeat_interleave(heads // t.shape[1], dim=1).transpose(0, 1)[None] for t in (q, k, v))
    weights = torch.matmul(q, k.transpose(2, 3)) * dim**-0.5
    weights = weights + torch.full((n, n), torch.finfo(q.dtype).min, dtype=q.dtype).triu(1)
    weights = torch.softmax(weights, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(weights, v)[0].transpose(0, 1)


def ours_logits(model: DecoderForCausalLM, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        hidden = model(ids, torch.arange(len(ids)), ContiguousAttention())
        return model.compute_logits(hidden)


@pytest.mark.parametrize("case", CASES)
def test_logits_match_transformers(tmp_path, case):
    family, overrides = CASES[case]
    path = build_tiny_checkpoint(tmp_path, family, **overrides)
    loaded = load_checkpoint(path)
    ref = hf_model(path)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, loaded.spec.vocab_size, (max(LENGTHS),), generator=gen)
    with torch.no_grad():
        want_all = ref(ids[None]).logits[0]
    for n in LENGTHS:
        got = ours_logits(loaded.model, ids[:n])
        assert got.dtype == torch.float32 and got.shape == (n, loaded.spec.vocab_size)
        torch.testing.assert_close(got[-1], want_all[n - 1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got, want_all, atol=1e-4, rtol=1e-4)


def test_spec_flags_per_family(tmp_path):
    cases = {
        "llama": ("llama", {"attention_bias": True}, dict(qkv_bias=True, o_bias=True, qk_norm=False)),
        "qwen2": ("qwen2", {}, dict(qkv_bias=True, o_bias=False, qk_norm=False)),
        "qwen3": ("qwen3", {}, dict(qkv_bias=False, o_bias=False, qk_norm=True, head_dim=32)),
        "mistral": ("mistral", {"num_kv_heads": 1}, dict(qkv_bias=False, num_kv_heads=1, sliding_window=None)),
    }
    for name, (family, overrides, expected) in cases.items():
        spec = load_checkpoint(build_tiny_checkpoint(tmp_path / name, family, **overrides)).spec
        assert isinstance(spec, ModelSpec)
        for key, value in expected.items():
            assert getattr(spec, key) == value, (name, key)


def test_rope_spec_and_context(tmp_path):
    spec = load_checkpoint(build_tiny_checkpoint(tmp_path, "qwen2", rope_scaling=YARN, max_position_embeddings=64)).spec
    assert spec.rope_type == "yarn" and spec.rope_scaling["factor"] == 4.0
    assert "rope_theta" not in spec.rope_scaling and spec.rope_theta == 10000.0
    assert spec.max_context_len == 256  # Qwen's yarn recipe leaves max_position_embeddings at the original


@pytest.mark.parametrize(
    "family, rope, top_level",
    [
        (
            "qwen2",
            {"rope_type": "yarn", "factor": 4.0},
            64,
        ),  # the rope dict has none: max_position_embeddings is not it
        ("llama", {**LLAMA3, "original_max_position_embeddings": 64}, 32),  # both: the top-level one wins
    ],
)
def test_top_level_original_max_position_embeddings_wins_as_in_transformers(tmp_path, family, rope, top_level):
    """Phi3-style configs keep the pretraining context at the top level; transformers gives it precedence when
    it builds the model (its config object still shows the rope dict's value), so graphtop must too."""
    import json

    path = build_tiny_checkpoint(tmp_path, family, rope_scaling=rope)
    config = json.loads((path / "config.json").read_text())
    config["original_max_position_embeddings"] = top_level
    (path / "config.json").write_text(json.dumps(config))
    loaded = load_checkpoint(path)
    assert loaded.spec.rope_scaling["original_max_position_embeddings"] == top_level
    ids = torch.randint(0, loaded.spec.vocab_size, (120,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf_model(path)(ids[None]).logits[0]
    torch.testing.assert_close(ours_logits(loaded.model, ids), want, atol=1e-4, rtol=1e-4)


def test_incremental_decode_matches_full_forward(tmp_path):
    """Prefill then one token at a time through the same `attn`: positions drive rope, not order."""
    path = build_tiny_checkpoint(tmp_path, "qwen3", rope_scaling=YARN)
    model = load_checkpoint(path).model
    ids = torch.randint(0, model.spec.vocab_size, (80,), generator=torch.Generator().manual_seed(2))
    want = ours_logits(model, ids)
    attn = ContiguousAttention()
    with torch.no_grad():
        got = [model.compute_logits(model(ids[:70], torch.arange(70), attn))[-1]]
        for pos in range(70, 80):
            got.append(model.compute_logits(model(ids[pos : pos + 1], torch.tensor([pos]), attn))[0])
    torch.testing.assert_close(torch.stack(got), want[69:], atol=1e-4, rtol=1e-4)


def test_ragged_batch_rows_are_independent(tmp_path):
    """Two requests concatenated in one flat batch give each request's solo logits."""
    model = load_checkpoint(build_tiny_checkpoint(tmp_path, "llama")).model
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randint(0, 500, (13,), generator=gen), torch.randint(0, 500, (21,), generator=gen)
    caches = [ContiguousAttention(), ContiguousAttention()]

    def ragged(q, k, v, layer_id):
        cut = len(a)
        return torch.cat(
            [caches[0](q[:cut], k[:cut], v[:cut], layer_id), caches[1](q[cut:], k[cut:], v[cut:], layer_id)]
        )

    with torch.no_grad():
        hidden = model(torch.cat([a, b]), torch.cat([torch.arange(len(a)), torch.arange(len(b))]), ragged)
    torch.testing.assert_close(model.compute_logits(hidden[: len(a)]), ours_logits(model, a), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model.compute_logits(hidden[len(a) :]), ours_logits(model, b), atol=1e-5, rtol=1e-5)


def test_sharded_checkpoint_loads(tmp_path):
    path = reshard(build_tiny_checkpoint(tmp_path, "qwen2"), max_shard_size="60KB")
    assert (path / "model.safetensors.index.json").is_file()
    assert len(list(path.glob("*.safetensors"))) > 2
    loaded = load_checkpoint(path)
    ids = torch.arange(40) * 7 % loaded.spec.vocab_size
    with torch.no_grad():
        want = hf_model(path)(ids[None]).logits[0]
    torch.testing.assert_close(ours_logits(loaded.model, ids), want, atol=1e-4, rtol=1e-4)


def test_dtype_and_tying(tmp_path):
    path = build_tiny_checkpoint(tmp_path, "qwen3", tie_word_embeddings=True)
    fp32 = load_checkpoint(path)
    assert fp32.dtype == torch.float32  # tiny checkpoints are saved fp32
    bf16 = load_checkpoint(path, dtype="bfloat16")
    model = bf16.model
    assert bf16.dtype == torch.bfloat16 and model.model.rotary_emb.cos_sin_cache.dtype == torch.float32
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert bf16.weights_bytes == sum(p.numel() for p in model.parameters()) * 2 == fp32.weights_bytes // 2
    assert not any(p.is_meta or p.requires_grad for p in model.parameters())
    ids = torch.arange(30) * 5 % bf16.spec.vocab_size
    ref = hf_model(path, dtype=torch.bfloat16, attn_implementation="eager")
    with torch.no_grad():
        want = ref(ids[None]).logits[0].float()
        got = model.compute_logits(model(ids, torch.arange(len(ids)), eager_attention))
    assert torch.equal(got, want)  # same op order as HF, down to bf16 rounding
    with pytest.raises(ValueError, match="unsupported dtype"):
        load_checkpoint(path, dtype="int8")


def test_eos_ids_merge_generation_config(tmp_path):
    import json

    path = build_tiny_checkpoint(tmp_path, "llama")
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 2, 5]}))
    assert load_checkpoint(path).spec.eos_token_ids == (0, 2, 5)
