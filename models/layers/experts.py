"""The experts of a mixture-of-experts layer: one gated MLP each, under the checkpoint's names, and the
same weights stacked per projection for the grouped kernels.

Checkpoints store every expert's projections as tensors of their own (``experts.3.gate_proj.weight``;
Mixtral's ``experts.3.w1.weight``), so each expert is a module with those parameters and loading stays a
name -> parameter copy, sharded by name under tensor parallelism like any projection. The grouped GEMM
(models/kernels/fused_moe.py) and the sorted torch path (``moe_torch.py``) read the weights stacked,
``w13`` [E, 2 * I, H] (gate rows, then up rows) and ``w2`` [E, H, I]; ``stack`` makes every expert's
parameters views into those two tensors, so the model holds its expert weights once. A stacked tensor
is plain state, not a parameter or buffer: whatever re-creates the parameters (``to_empty`` from meta,
``to``) must call ``stack`` again, as ``DecoderForCausalLM.tie_weights`` is re-run for a tied lm_head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import torch
from torch import nn

from .mlp import ACTIVATIONS


@dataclass(frozen=True)
class ExpertNames:
    """What a family's checkpoints call an expert's gate, up and down projections."""

    gate: str
    up: str
    down: str

    def column(self) -> tuple[str, str]:
        """The projections split by output rows under tensor parallelism (gate, up)."""
        return self.gate, self.up


class Expert(nn.Module):
    """down(act(gate(x)) * up(x)) without biases, its projections under the family's ``names``."""

    def __init__(self, hidden_size: int, intermediate_size: int, names: ExpertNames) -> None:
        super().__init__()
        self.names = names
        self.add_module(names.gate, nn.Linear(hidden_size, intermediate_size, bias=False))
        self.add_module(names.up, nn.Linear(hidden_size, intermediate_size, bias=False))
        self.add_module(names.down, nn.Linear(intermediate_size, hidden_size, bias=False))

    def projections(self) -> tuple[nn.Linear, nn.Linear, nn.Linear]:
        """(gate, up, down)."""
        n = self.names
        return getattr(self, n.gate), getattr(self, n.up), getattr(self, n.down)


class ExpertBank(nn.ModuleList):
    """``num_experts`` experts (``experts.<e>.`` in the checkpoint) with their weights stacked (``w13``, ``w2``)."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, names: ExpertNames, act: str):
        super().__init__(Expert(hidden_size, intermediate_size, names) for _ in range(num_experts))
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.act: Callable[[torch.Tensor], torch.Tensor] = ACTIVATIONS[act]
        self.w13: Optional[torch.Tensor] = None
        self.w2: Optional[torch.Tensor] = None
        self.stack()

    def experts(self) -> Iterator[Expert]:
        return iter(self)  # type: ignore[arg-type]

    def _stacked(self) -> bool:
        """Whether every expert's parameters still are views into ``w13`` / ``w2`` (nothing re-created them)."""
        w13, w2 = self.w13, self.w2
        if w13 is None or w2 is None or w13.device.type == "meta":
            return False
        ptr13, ptr2 = w13.untyped_storage().data_ptr(), w2.untyped_storage().data_ptr()
        for expert in self.experts():
            gate, up, down = (p.weight for p in expert.projections())
            for p, ptr, like in ((gate, ptr13, w13), (up, ptr13, w13), (down, ptr2, w2)):
                if p.device != like.device or p.dtype != like.dtype or p.untyped_storage().data_ptr() != ptr:
                    return False
        return True

    @torch.no_grad()
    def stack(self) -> None:
        """Copy every expert's weights into fresh ``w13`` / ``w2`` and make its parameters views of them
        (no-op where they already are). Takes one layer's expert weights of extra memory while it runs."""
        if self._stacked():
            return
        first = next(self.experts()).projections()[0].weight
        e, h, i = len(self), self.hidden_size, self.intermediate_size
        w13 = torch.empty((e, 2 * i, h), dtype=first.dtype, device=first.device)
        w2 = torch.empty((e, h, i), dtype=first.dtype, device=first.device)
        for n, expert in enumerate(self.experts()):
            gate, up, down = expert.projections()
            for proj, view in ((gate, w13[n, :i]), (up, w13[n, i:]), (down, w2[n])):
                view.copy_(proj.weight)
                proj.weight = nn.Parameter(view, requires_grad=proj.weight.requires_grad)
        self.w13, self.w2 = w13, w2

    def weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(w13 [E, 2I, H], w2 [E, H, I]): the experts' weights as the grouped paths read them."""
        assert self.w13 is not None and self.w2 is not None, "ExpertBank.stack() sets them"
        return self.w13, self.w2
