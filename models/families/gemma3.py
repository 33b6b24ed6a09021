"""Gemma 3, text only (``Gemma3ForCausalLM``, model_type gemma3_text): Gemma 2's sandwich block, norms,
GeGLU, scaled embeddings and query scale, plus per-head q/k norms ((1 + w) form) and local layers (five in
six by default, ``layer_types``) that attend within ``sliding_window`` and rotate with a RoPE of their own
(``rope_local_base_freq``, or ``rope_parameters["sliding_attention"]``), while the global layers take the
model's RoPE and its scaling. transformers applies no attention soft cap to Gemma 3 (the config key is
ignored), so neither does graphtop; the output logits are capped where ``final_logit_softcapping`` is set.
"""

from __future__ import annotations

from typing import Any, Optional

from ..decoder import DecoderForCausalLM
from ..errors import CheckpointError
from ..family import Family, flag, positive, read_spec
from ..layers.norm import OffsetRMSNorm
from ..layers.sandwich import SandwichLayer
from ..spec import ModelSpec, RopeSettings, located, read_rope

ARCHITECTURE = "Gemma3ForCausalLM"


class Gemma3Model(DecoderForCausalLM):
    layer_cls = SandwichLayer
    norm_cls = OffsetRMSNorm


def _ropes(config: Any, where: Optional[str]) -> tuple[RopeSettings, RopeSettings]:
    """(the global layers' RoPE, the local layers'): transformers 5 keeps one rope dict per layer type,
    transformers 4 ``rope_theta``/``rope_scaling`` and ``rope_local_base_freq``."""
    max_pos = int(config.max_position_embeddings)
    params = getattr(config, "rope_parameters", None) or {}
    if "full_attention" in params or "sliding_attention" in params:
        full = read_rope(config, max_pos, where, params.get("full_attention") or {})
        return full, read_rope(config, max_pos, where, params.get("sliding_attention") or {})
    local = float(getattr(config, "rope_local_base_freq", None) or 10000.0)
    return read_rope(config, max_pos, where), RopeSettings(local, None)


def read(config: Any, where: Optional[str]) -> ModelSpec:
    if getattr(config, "use_bidirectional_attention", False):
        raise CheckpointError(located("use_bidirectional_attention is not supported (a causal decoder only)", where))
    full, local = _ropes(config, where)
    bias = flag(config, "attention_bias")
    return read_spec(
        config,
        where,
        ARCHITECTURE,
        qkv_bias=bias,
        o_bias=bias,
        qk_norm=True,
        rope=full,
        activation_key="hidden_activation",
        activation_default="gelu_pytorch_tanh",
        attn_scale=float(config.query_pre_attn_scalar) ** -0.5,
        final_softcap=positive(config, "final_logit_softcapping"),
        embed_scale=int(config.hidden_size) ** 0.5,
        local_rope_theta=local.theta,
        local_rope_scaling=local.scaling,
    )


FAMILY = Family(ARCHITECTURE, "gemma3_text", read, Gemma3Model, tensor_parallel=False)
