"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (per-head q/k norms, ``attention_bias``,
its own head_dim) with a mixture of experts as the MLP of every layer but those in ``mlp_only_layers`` or
off the ``decoder_sparse_step``, which keep a dense MLP of ``intermediate_size``. The router (``mlp.gate``)
takes the softmax over all experts, then the top ``num_experts_per_tok``, renormalised to sum to one only
with ``norm_topk_prob``; the weights are rounded to the model's dtype (models/layers/moe_routing.py). Each
expert is a SwiGLU MLP of ``moe_intermediate_size`` (``mlp.experts.<e>.gate_proj`` / ``up_proj`` /
``down_proj``). Sliding windows as in Qwen2 (every layer, with ``use_sliding_window``).
"""

from __future__ import annotations

from typing import Any, Optional

from ..decoder import DecoderForCausalLM
from ..family import Family, flag, read_experts, read_spec
from ..layers.moe import MoELayer
from ..spec import ModelSpec

ARCHITECTURE = "Qwen3MoeForCausalLM"


class Qwen3MoeModel(DecoderForCausalLM):
    layer_cls = MoELayer


def _sparse_layers(config: Any) -> tuple[int, ...]:
    """transformers' rule: a layer is sparse unless listed in ``mlp_only_layers``, and when its index + 1
    is a multiple of ``decoder_sparse_step``."""
    dense = set(getattr(config, "mlp_only_layers", None) or ())
    step = int(getattr(config, "decoder_sparse_step", None) or 1)
    layers = range(int(config.num_hidden_layers))
    return tuple(i for i in layers if i not in dense and (i + 1) % step == 0)


def read(config: Any, where: Optional[str]) -> ModelSpec:
    bias = flag(config, "attention_bias")
    return read_spec(
        config,
        where,
        ARCHITECTURE,
        qkv_bias=bias,
        o_bias=bias,
        qk_norm=True,
        norm_topk_prob=flag(config, "norm_topk_prob"),
        moe_layers=_sparse_layers(config),
        **read_experts(config, where, "num_experts", "moe_intermediate_size"),
    )


FAMILY = Family(ARCHITECTURE, "qwen3_moe", read, Qwen3MoeModel)
