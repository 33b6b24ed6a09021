"""Qwen2 (and Qwen2.5): biases on q, k and v always, on o never. With ``use_sliding_window`` the layers from
``max_window_layers`` on attend within ``sliding_window`` (their ``layer_types`` entry says so); without it
transformers nulls the window."""

from __future__ import annotations

from typing import Any, Optional

from ..family import Family, read_spec
from ..spec import ModelSpec

ARCHITECTURE = "Qwen2ForCausalLM"


def read(config: Any, where: Optional[str]) -> ModelSpec:
    return read_spec(config, where, ARCHITECTURE, qkv_bias=True)


FAMILY = Family(ARCHITECTURE, "qwen2", read)
