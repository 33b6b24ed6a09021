"""Top-k routing of a mixture-of-experts layer: which experts each token takes, and with which weights.

Both families take the softmax of the router's logits over all experts in float32, then the ``k`` largest
(transformers' op order, so the same experts win ties and fp32 logits agree to the bit):

* Mixtral renormalises the k probabilities to sum to one (the same numbers as a softmax over the k top
  logits) and keeps them in float32; the expert outputs are weighted in float32 and rounded after.
* Qwen3-MoE renormalises only where ``norm_topk_prob`` says so, and rounds the weights to the model's dtype
  before weighting.

Every op is a fixed-shape torch op with no host sync: routing runs the same inside a captured graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Routing:
    """A family's routing rule: ``top_k`` experts per token, ``renormalize`` their probabilities, keep the
    weights in float32 (``weights_fp32``, Mixtral) or round them to the logits' dtype (Qwen3-MoE)."""

    top_k: int
    renormalize: bool
    weights_fp32: bool


class TopKRouter(nn.Module):
    """The router's linear layer (``gate.weight``, [num_experts, hidden], no bias) and its rule."""

    def __init__(self, hidden_size: int, num_experts: int, routing: Routing) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size))
        self.routing = routing

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k], expert ids [T, k] int64) of the rows of ``x``."""
        return route(F.linear(x, self.weight), self.routing)


def route(logits: torch.Tensor, routing: Routing) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k], ids [T, k]) from router logits [T, E] by ``routing``'s rule (module docstring)."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, routing.top_k, dim=-1)
    if routing.renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return (weights if routing.weights_fp32 else weights.to(logits.dtype)), ids
