"""Gemma 2: the sandwich block (a norm before and after attention and the MLP), Gemma's (1 + w) RMSNorm, a
GeGLU MLP (``hidden_activation``, GELU with tanh), embeddings scaled by sqrt(hidden_size), attention logits
scaled by query_pre_attn_scalar ** -0.5 and soft-capped (``attn_logit_softcapping``), the output logits
soft-capped (``final_logit_softcapping``), and local layers (``layer_types``: every other one) attending
within ``sliding_window``. Tied embeddings, as the checkpoints ship.
"""

from __future__ import annotations

from typing import Any, Optional

from ..decoder import DecoderForCausalLM
from ..family import Family, flag, positive, read_spec
from ..layers.norm import OffsetRMSNorm
from ..layers.sandwich import SandwichLayer
from ..spec import ModelSpec

ARCHITECTURE = "Gemma2ForCausalLM"


class Gemma2Model(DecoderForCausalLM):
    layer_cls = SandwichLayer
    norm_cls = OffsetRMSNorm


def read(config: Any, where: Optional[str]) -> ModelSpec:
    bias = flag(config, "attention_bias")
    return read_spec(
        config,
        where,
        ARCHITECTURE,
        qkv_bias=bias,
        o_bias=bias,
        activation_key="hidden_activation",
        activation_default="gelu_pytorch_tanh",
        attn_scale=float(config.query_pre_attn_scalar) ** -0.5,
        attn_softcap=positive(config, "attn_logit_softcapping"),
        final_softcap=positive(config, "final_logit_softcapping"),
        embed_scale=int(config.hidden_size) ** 0.5,
    )


FAMILY = Family(ARCHITECTURE, "gemma2", read, Gemma2Model, tensor_parallel=False)
