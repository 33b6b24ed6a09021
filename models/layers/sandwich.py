"""A decoder layer with a norm before and after each sublayer (Gemma 2 and 3's "sandwich"):

    x = x + post_attention_norm(attention(input_norm(x)))
    x = x + post_feedforward_norm(mlp(pre_feedforward_norm(x)))

Parameter names are transformers'. It runs on the torch layers only: the fused kernels carry a pre-norm
block's norms in their prologues and epilogues (``decoder.DecoderLayer``), which this order does not fit.
"""

from __future__ import annotations

import torch
from torch import nn

from ..spec import ModelSpec
from .attention import Attention, AttentionFn
from .mlp import GatedMLP
from .rope import RopeFactors


class SandwichLayer(nn.Module):
    def __init__(self, spec: ModelSpec, layer_id: int, norm_cls: type[nn.Module]) -> None:
        super().__init__()
        h, eps = spec.hidden_size, spec.rms_norm_eps
        self.input_layernorm = norm_cls(h, eps)
        self.self_attn = Attention(spec, layer_id, norm_cls)
        self.post_attention_layernorm = norm_cls(h, eps)
        self.pre_feedforward_layernorm = norm_cls(h, eps)
        self.mlp = GatedMLP(h, spec.intermediate_size, spec.mlp_bias, spec.hidden_act)
        self.post_feedforward_layernorm = norm_cls(h, eps)

    def forward(self, x: torch.Tensor, rope: RopeFactors, attn: AttentionFn) -> torch.Tensor:
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), rope, attn))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
