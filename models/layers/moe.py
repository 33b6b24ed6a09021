"""The mixture-of-experts block and the pre-norm decoder layer that holds it (Qwen3-MoE, Mixtral).

A sparse block routes each token to ``num_experts_per_tok`` of its experts (``moe_routing.py``) and sums
their outputs by the routing weights. Which path computes the experts is decided per call from the input
alone: on CUDA with Triton the grouped GEMM (models/kernels/fused_moe.py: no host sync, captured in decode
and prefill graphs), elsewhere the torch path sorted by expert (``moe_torch.py``).

Tensor parallelism splits every expert's MLP features like a dense MLP's (gate/up rows, down columns:
models/parallel/loading.py), each rank routes identically from the same replicated router and activations,
and the block's output is a partial sum that ``reduce`` (the group's all-reduce) adds up.
"""

from __future__ import annotations

from typing import Callable, ClassVar, Optional

import torch
from torch import nn

from ..kernels import fused as tk
from ..kernels.fused_moe import grouped_experts
from ..spec import ModelSpec
from .attention import Attention, AttentionFn
from .experts import ExpertBank, ExpertNames
from .mlp import GatedMLP
from .moe_routing import Routing, TopKRouter
from .moe_torch import sorted_experts
from .rope import RopeFactors


def grouped_gemm_runs(x: torch.Tensor) -> bool:
    """Whether the experts of ``x``'s rows take the grouped GEMM (CUDA with Triton, any float dtype)."""
    return tk.HAVE_TRITON and x.is_cuda


class SparseMoE(nn.Module):
    """``gate`` (the router) and ``experts``, HF's names; forward(x [T, H]) -> [T, H]."""

    def __init__(self, spec: ModelSpec, names: ExpertNames, routing: Routing) -> None:
        super().__init__()
        self.gate = TopKRouter(spec.hidden_size, spec.num_experts, routing)
        self.experts = ExpertBank(
            spec.num_experts, spec.hidden_size, spec.moe_intermediate_size, names, spec.hidden_act
        )
        #: the tensor-parallel group's all-reduce of the partial sums (None: the whole experts on this device)
        self.reduce: Optional[Callable[[torch.Tensor], torch.Tensor]] = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.gate(x)
        w13, w2 = self.experts.weights()
        if grouped_gemm_runs(x):
            out = grouped_experts(x, w13, w2, weights, ids, self.experts.act)
        else:
            out = sorted_experts(x, w13, w2, weights, ids, self.experts.act)
        return out if self.reduce is None else self.reduce(out)


class MoELayer(nn.Module):
    """The pre-norm block with a sparse MLP: x + attn(norm(x)), then x + moe(norm(x)); a layer the spec does
    not list in ``moe_layers`` has the dense gated MLP there instead (Qwen3-MoE's ``mlp_only_layers``).

    A family subclasses it in its own file, naming the block's attribute (``block``: ``mlp``, Mixtral's
    ``block_sparse_moe``), its experts' projections (``expert_names``) and its routing weights' dtype
    (``weights_fp32``)."""

    block: ClassVar[str] = "mlp"
    expert_names: ClassVar[ExpertNames] = ExpertNames("gate_proj", "up_proj", "down_proj")
    weights_fp32: ClassVar[bool] = False

    def __init__(self, spec: ModelSpec, layer_id: int, norm_cls: type[nn.Module]) -> None:
        super().__init__()
        h, eps = spec.hidden_size, spec.rms_norm_eps
        self.input_layernorm = norm_cls(h, eps)
        self.self_attn = Attention(spec, layer_id, norm_cls)
        self.post_attention_layernorm = norm_cls(h, eps)
        if spec.sparse(layer_id):
            routing = Routing(spec.num_experts_per_tok, spec.norm_topk_prob, self.weights_fp32)
            ffn: nn.Module = SparseMoE(spec, self.expert_names, routing)
        else:
            ffn = GatedMLP(h, spec.intermediate_size, spec.mlp_bias, spec.hidden_act)
        self.add_module(self.block, ffn)

    @property
    def ffn(self) -> nn.Module:
        """The layer's MLP: ``SparseMoE`` or, in a dense layer, ``GatedMLP``."""
        return getattr(self, self.block)

    def forward(self, x: torch.Tensor, rope: RopeFactors, attn: AttentionFn) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, attn)
        return x + self.ffn(self.post_attention_layernorm(x))


def expert_banks(model: nn.Module) -> list[ExpertBank]:
    """Every ``ExpertBank`` of ``model`` (none in a dense model)."""
    return [m for m in model.modules() if isinstance(m, ExpertBank)]


def expert_weight_bytes(model: nn.Module) -> int:
    """Bytes of ``model``'s expert weights (every expert of every sparse layer; a rank's share under tensor
    parallelism): what the memory ledger shows as experts."""
    return sum(w.numel() * w.element_size() for bank in expert_banks(model) for w in bank.weights())
