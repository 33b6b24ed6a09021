"""Mixtral (8x7B, 8x22B): Mistral's attention (no biases; with ``sliding_window`` set every layer attends
within it) and in every layer a mixture of ``num_local_experts`` SwiGLU experts of ``intermediate_size``
(``block_sparse_moe.experts.<e>.w1`` gate, ``w3`` up, ``w2`` down). The router (``block_sparse_moe.gate``)
takes the top ``num_experts_per_tok`` of the softmax over all experts, renormalised (a softmax over the
top logits), and keeps the weights in float32 (models/layers/moe_routing.py).
"""

from __future__ import annotations

from typing import Any, Optional

from ..decoder import DecoderForCausalLM
from ..family import Family, read_experts, read_spec
from ..layers.experts import ExpertNames
from ..layers.moe import MoELayer
from ..spec import ModelSpec

ARCHITECTURE = "MixtralForCausalLM"


class MixtralLayer(MoELayer):
    block = "block_sparse_moe"
    expert_names = ExpertNames("w1", "w3", "w2")
    weights_fp32 = True


class MixtralModel(DecoderForCausalLM):
    layer_cls = MixtralLayer


def read(config: Any, where: Optional[str]) -> ModelSpec:
    return read_spec(
        config,
        where,
        ARCHITECTURE,
        qkv_bias=False,
        norm_topk_prob=True,
        moe_layers=tuple(range(int(config.num_hidden_layers))),
        **read_experts(config, where, "num_local_experts", "intermediate_size"),
    )


FAMILY = Family(ARCHITECTURE, "mixtral", read, MixtralModel)
