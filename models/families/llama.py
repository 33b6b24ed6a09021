"""Llama (and the many checkpoints that reuse its architecture: SmolLM2, ...): the pre-norm decoder as is.

``attention_bias`` puts biases on q, k, v *and* o; ``mlp_bias`` on the MLP's three projections. Llama has no
sliding window: a ``sliding_window`` key in its config is ignored, as transformers ignores it.
"""

from __future__ import annotations

from typing import Any, Optional

from ..family import Family, flag, read_spec
from ..spec import ModelSpec

ARCHITECTURE = "LlamaForCausalLM"


def read(config: Any, where: Optional[str]) -> ModelSpec:
    bias = flag(config, "attention_bias")
    return read_spec(
        config, where, ARCHITECTURE, qkv_bias=bias, o_bias=bias, mlp_bias=flag(config, "mlp_bias"), sliding=False
    )


FAMILY = Family(ARCHITECTURE, "llama", read)
