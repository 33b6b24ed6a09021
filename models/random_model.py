"""Random-weight models of published architecture shapes, built straight on the target device.

Benchmarks need real shapes (Qwen3-0.6B, Llama-3.1-8B, SmolLM2-135M) but no weights can be downloaded: the
configs below are written from the published numbers, the weights are seeded noise.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from .loader import LoadedCheckpoint, _materialise
from .registry import spec_from_hf_config

SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": dict(
        model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_size=1024, intermediate_size=3072,
        num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        vocab_size=151936, max_position_embeddings=40960, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, attention_bias=False, eos_token_id=151645, bos_token_id=151643,
    ),
    "smollm2-135m": dict(
        model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=576, intermediate_size=1536,
        num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, head_dim=64, vocab_size=49152,
        max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
        attention_bias=False, mlp_bias=False, eos_token_id=2, bos_token_id=1,
    ),
    "llama-3.1-8b": dict(
        model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=False, attention_bias=False, mlp_bias=False, eos_token_id=128001,
        bos_token_id=128000,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=8192),
    ),
}


class IdsTokenizer:
    """Stands in for a tokenizer when prompts are token ids and nothing is detokenized."""

    chat_template = None
    all_special_ids: list[int] = []

    def __init__(self, eos_token_id: int):
        self.eos_token_id = eos_token_id

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [b + 3 for b in text.encode("utf-8")]

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        return ""


def hf_config_for(shape: str, **overrides: Any) -> Any:
    from transformers import AutoConfig

    if shape not in SHAPES:
        raise KeyError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    kw = dict(SHAPES[shape])
    kw.update(overrides)
    model_type = kw.pop("model_type")
    return AutoConfig.for_model(model_type, **kw)


@torch.no_grad()
def random_checkpoint(hf_config: Any, device: str = "cuda", dtype: torch.dtype = torch.bfloat16,
                      seed: int = 0, std: float = 0.02) -> LoadedCheckpoint:
    spec = spec_from_hf_config(hf_config, "<random>")
    eos = getattr(hf_config, "eos_token_id", None)
    spec = replace(spec, eos_token_ids=(int(eos),) if eos is not None else ())
    model = _materialise(spec, device, dtype)
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in model.named_parameters():
        if p.dim() == 1:  # norms (weights 1) and biases (0)
            p.fill_(1.0 if name.endswith("norm.weight") else 0.0)
        else:
            p.normal_(0.0, std, generator=gen)
    model.eval().requires_grad_(False)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return LoadedCheckpoint(model, IdsTokenizer(int(eos or 0)), spec, Path(f"<random {spec.architecture}>"),
                            hf_config, weights)
