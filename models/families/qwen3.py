"""Qwen3: per-head RMSNorm on q and k before RoPE (``q_norm``, ``k_norm``), ``attention_bias`` on q, k, v and
o as in Llama, and a head_dim of its own (not hidden / heads). Sliding windows as in Qwen2."""

from __future__ import annotations

from typing import Any, Optional

from ..family import Family, flag, read_spec
from ..spec import ModelSpec

ARCHITECTURE = "Qwen3ForCausalLM"


def read(config: Any, where: Optional[str]) -> ModelSpec:
    bias = flag(config, "attention_bias")
    return read_spec(config, where, ARCHITECTURE, qkv_bias=bias, o_bias=bias, qk_norm=True)


FAMILY = Family(ARCHITECTURE, "qwen3", read)
