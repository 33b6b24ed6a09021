"""Mistral: the pre-norm decoder without biases; with ``sliding_window`` set, every layer attends within the
window (transformers' sliding mask for all layers)."""

from __future__ import annotations

from typing import Any, Optional

from ..family import Family, read_spec
from ..spec import ModelSpec

ARCHITECTURE = "MistralForCausalLM"


def read(config: Any, where: Optional[str]) -> ModelSpec:
    return read_spec(config, where, ARCHITECTURE, qkv_bias=False)


FAMILY = Family(ARCHITECTURE, "mistral", read)
