"""Rope tables vs transformers' rotary embeddings, for every supported rope type (exact)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from support.tiny_models import tiny_config

from graphtop.models import CheckpointError
from graphtop.models.layers.rope import RotaryEmbedding
from graphtop.models.registry import spec_from_hf_config
from graphtop.models.spec import ModelSpec

ROPES = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.5},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    "yarn-legacy-type-key": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    "yarn-attention-factor": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "attention_factor": 0.8,
        "beta_slow": 2.0,
    },
    "yarn-mscale-untruncated": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "mscale": 0.707,
        "mscale_all_dim": 1.0,
        "truncate": False,
    },
}


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("name", ROPES)
def test_cos_sin_equal_transformers(family, name):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    overrides = {"rope_theta": 500000.0}
    if ROPES[name] is not None:
        overrides["rope_scaling"] = ROPES[name]
    config = tiny_config(family, **overrides)
    spec = spec_from_hf_config(config)
    hf = (LlamaRotaryEmbedding if family == "llama" else Qwen3RotaryEmbedding)(config)
    positions = torch.tensor([0, 1, 5, 63, 64, 65, 200, 255])
    cos, sin = hf(torch.zeros(1, dtype=torch.float32), positions[None])
    ours = RotaryEmbedding(spec).cos_sin_cache[positions]
    half = spec.head_dim // 2
    assert torch.equal(ours[:, :half], cos[0, :, :half]) and torch.equal(cos[0, :, :half], cos[0, :, half:])
    assert torch.equal(ours[:, half:], sin[0, :, :half])


def test_yarn_denormal_beta_is_the_ramps_end():
    """A beta_slow so small that HF's ratio overflows (found by tests/fuzz/test_fuzz_config_json.py) gives the
    same table as any huge ratio, not an OverflowError."""
    tables = []
    for beta_slow in (5e-324, 1e-300):
        rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_slow": beta_slow}
        spec = spec_from_hf_config(tiny_config("llama", rope_scaling=rope))
        tables.append(RotaryEmbedding(spec).cos_sin_cache)
    assert torch.isfinite(tables[0]).all() and torch.equal(tables[0], tables[1])


def test_unsupported_rope_type_is_refused():
    config = tiny_config("llama", rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    with pytest.raises(CheckpointError, match="unsupported rope_type 'dynamic'"):
        spec_from_hf_config(config)


@pytest.mark.parametrize("key", ["rope_parameters", "rope_scaling"])
def test_unsupported_rope_type_is_refused_on_the_raw_config_before_transformers(key):
    """transformers warns about a rope type it does not know (a second stderr line): the raw check comes first."""
    from graphtop.models.checkpoint.config_check import check_config_fields

    base = {k: v for k, v in tiny_config("llama").to_dict().items() if k not in ("rope_parameters", "rope_scaling")}
    for rope, needle in (({"rope_type": "bogus", "rope_theta": 1e4}, "'bogus'"), ({"type": 5}, "rope_type 5")):
        with pytest.raises(CheckpointError, match=needle):
            check_config_fields({**base, key: rope}, "m")
    check_config_fields({**base, key: {"type": "linear", "factor": 2.0}}, "m")  # the legacy key, supported


def test_transformers4_config_layout():
    """v4 configs carry `rope_theta` and `rope_scaling` (legacy `type` key) as attributes."""
    from types import SimpleNamespace

    config = SimpleNamespace(
        architectures=["Qwen2ForCausalLM"],
        vocab_size=100,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        rope_theta=1e6,
        rope_scaling={"type": "yarn", "factor": 4.0},
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        eos_token_id=[1, 2],
        bos_token_id=None,
        hidden_act="silu",
        sliding_window=None,
    )
    spec = spec_from_hf_config(config)
    assert spec.rope_theta == 1e6 and spec.head_dim == 16 and spec.eos_token_ids == (1, 2)
    assert spec.rope_scaling == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}
    assert spec.qkv_bias and not spec.o_bias and spec.max_context_len == 4096


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rope_factors_rotate_exactly_like_apply_rope(dtype):
    """The per-forward factors (full-width cos, sign-folded sin) give apply_rope's result bit for bit."""
    from graphtop.models.layers.rope import apply_rope

    spec = ModelSpec(
        architecture="LlamaForCausalLM",
        vocab_size=32,
        hidden_size=64,
        intermediate_size=128,
        num_layers=1,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        rope_scaling=None,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        qkv_bias=False,
        qk_norm=False,
        eos_token_ids=(0,),
        bos_token_id=None,
    )
    rope = RotaryEmbedding(spec)
    positions = torch.tensor([0, 3, 17, 63])
    x = torch.randn(4, 4, 16).to(dtype)
    cos, sin = rope.cos_sin_cache[positions].to(dtype).unsqueeze(1).chunk(2, dim=-1)
    assert torch.equal(rope.factors(positions, dtype).apply(x), apply_rope(x, cos, sin))
