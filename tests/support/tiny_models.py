"""Tiny real HF checkpoints for the models tests (a helper module, not a conftest).

Each checkpoint is made by transformers itself (config class + `from_config` +
`save_pretrained`), so the tests check our loader and decoder against exactly what HF
writes and runs. Weights are re-drawn from a seeded generator with non-trivial norms and
biases: HF initialises norms to 1 and biases to 0, which would hide loading mistakes.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import torch

from graphtop.models.synthetic.demo_corpus import CORPUS
from graphtop.models.synthetic.tokenizer_train import train_byte_level_bpe

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "qwen3_moe", "mixtral")
_ALIASES = {
    "num_kv_heads": "num_key_value_heads",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
}


@functools.lru_cache(maxsize=1)
def shared_tokenizer() -> Any:
    """Trained once per process; 512 tokens keeps the embedding tiny."""
    return train_byte_level_bpe(CORPUS, vocab_size=512)


def tiny_config(family: str, **overrides: Any) -> Any:
    """A 2-layer, hidden-64 config of `family`; overrides use HF names or the aliases above."""
    from transformers import (
        Gemma2Config,
        Gemma3TextConfig,
        LlamaConfig,
        MistralConfig,
        MixtralConfig,
        Phi3Config,
        Qwen2Config,
        Qwen3Config,
        Qwen3MoeConfig,
    )

    tokenizer = shared_tokenizer()
    base: dict[str, Any] = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
    )
    if family == "mistral":
        base["sliding_window"] = None
    if family == "qwen3":
        base["head_dim"] = 32  # != 64 / 4: Qwen3 decouples head_dim from hidden/heads
    if family in ("gemma2", "gemma3"):
        # as the real ones: head_dim != hidden / heads, a query scale of its own, a local layer then a global one;
        # a window the tests' prompts outgrow
        base.update(
            head_dim=32,
            query_pre_attn_scalar=24,
            sliding_window=16,
            layer_types=["sliding_attention", "full_attention"],
            tie_word_embeddings=True,
        )
    if family == "gemma2":
        base.update(attn_logit_softcapping=50.0, final_logit_softcapping=30.0)
    if family == "gemma3":
        base["rope_local_base_freq"] = 100.0  # the local layers' own RoPE base
    if family == "qwen3_moe":  # 8 experts of 32 features, 2 a token; the dense width only for mlp_only_layers
        base.update(head_dim=32, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True)
    if family == "mixtral":  # 4 experts of intermediate_size features, 2 a token
        base.update(sliding_window=None, num_local_experts=4, num_experts_per_tok=2, intermediate_size=48)
    for key, value in copy.deepcopy(overrides).items():  # HF mutates rope dicts in place
        base[_ALIASES.get(key, key)] = value
    classes = {
        "llama": LlamaConfig,
        "mistral": MistralConfig,
        "qwen2": Qwen2Config,
        "qwen3": Qwen3Config,
        "gemma2": Gemma2Config,
        "gemma3": Gemma3TextConfig,
        "phi3": Phi3Config,
        "qwen3_moe": Qwen3MoeConfig,
        "mixtral": MixtralConfig,
    }
    return classes[family](**base)


@torch.no_grad()
def _randomise(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        noise = torch.randn(param.shape, generator=gen)
        if name.endswith("norm.weight"):
            param.copy_(1.0 + 0.2 * noise)
        elif name.endswith("bias"):
            param.copy_(0.2 * noise)
        else:
            param.copy_(noise / param.shape[-1] ** 0.5)


def build_tiny_checkpoint(
    tmp_path: Path, family: str, *, max_shard_size: str | int | None = None, seed: int = 0, **overrides: Any
) -> Path:
    """Save a tiny random `family` checkpoint (fp32 safetensors + tokenizer) under tmp_path."""
    from transformers import AutoModelForCausalLM

    config = tiny_config(family, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _randomise(model, seed)
    folder = Path(tmp_path) / f"{family}-{seed}"
    shard = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(folder, **shard)
    shared_tokenizer().save_pretrained(folder)
    return folder


def reshard(folder: Path, max_shard_size: str | int) -> Path:
    """Re-save an existing checkpoint folder as sharded safetensors with an index."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    for file in folder.glob("*.safetensors"):
        file.unlink()
    model.save_pretrained(folder, max_shard_size=max_shard_size)
    return folder
