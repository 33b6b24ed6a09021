"""A decoder layer on the fused-GEMV path (decode at <= ``gemv.MAX_M`` rows), with everything it reads looked
up once.

Why: a decode step's forward is the same ~5 launches a layer every step, and on the host each launch was
surrounded by nn.Module attribute lookups: submodules and parameters go through ``Module.__getattr__``
(0.6-0.8 µs each on the CPU bench/eager_launch_bench.py runs on), and asking a plain projection for its own
``gemv_add`` raises inside ``getattr`` (1.2 µs). About 25 a layer: a fifth of an eager step's host time
once the launches themselves are cheap (models/kernels/launch.py). Graph replays run none of it; eager
steps (while buckets capture, and for batches without a graph) run all of it.

``DecoderLayer.bind_small`` builds one at the layer's first fused-GEMV forward, and again after any of its
kernel settings changes; the tensors are the layer's own parameters (the same objects: a checkpoint loaded
into the model in place is seen), the settings those of its ``LayerKernels`` at that moment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn

from ..kernels import fused_mlp as tm
from ..kernels import gemv as tg
from .norm import RMSNorm

AddInto = Callable[[torch.Tensor, torch.Tensor, bool, bool], None]
"""A projection's own ``h += proj(x)`` (a tensor-parallel row shard: models/parallel/layers.py)."""
Attend = Callable[..., torch.Tensor]
"""``Attention.attend_fused``: the fused q|k|v projection in, o ([rows, heads * head_dim]) out."""


@dataclass(frozen=True)
class Projection:
    """A projection's weight and bias, and its own residual-adding launch if it brings one."""

    weight: torch.Tensor
    bias: Optional[torch.Tensor]
    add_into: Optional[AddInto]

    @classmethod
    def of(cls, proj: nn.Linear) -> "Projection":
        return cls(proj.weight, proj.bias, getattr(proj, "gemv_add", None))

    def norm_in(self, x: torch.Tensor, norm: tuple[torch.Tensor, float], pdl: bool, trigger: bool) -> torch.Tensor:
        """``proj(RMSNorm(x))``, the norm in the GEMV's prologue (its weight folded into the projection's:
        ``norm.fold_norm``). ``trigger``: without ``pdl``, let the PDL-launched GEMV after it start early."""
        return tg.gemv(x, self.weight, self.bias, norm_weight=norm[0], eps=norm[1], pdl=pdl, trigger=trigger)


@dataclass(frozen=True)
class SmallLayer:
    """One layer's decode at <= ``gemv.MAX_M`` rows: 5 launches (4 with the MLP in one), RMSNorms in the GEMV
    prologues, residual adds in their epilogues; ``h``, the residual stream, is updated in place."""

    qkv: Projection
    o: Projection
    gate_up: Projection
    down: Projection
    input_norm: tuple[torch.Tensor, float]
    post_norm: tuple[torch.Tensor, float]
    attend: Attend
    pdl: tuple[bool, bool, bool, bool]  # each projection's GEMV (qkv, o, gate_up, down)
    gate_up_trigger: bool
    fused_mlp: bool
    fused_mlp_pdl: bool

    def forward(self, h: torch.Tensor, positions: torch.Tensor, rope: nn.Module, attn: Callable) -> None:
        qkv = self.qkv.norm_in(h, self.input_norm, self.pdl[0], False)
        _add(self.o, self.attend(qkv, positions, rope, attn), h, self.pdl[1])
        self.mlp(h)

    def mlp(self, h: torch.Tensor) -> None:
        """``h += MLP(RMSNorm(h))``: one launch where ``fused_mlp`` (at most ``fused_mlp.MAX_ROWS`` rows), else
        the gate|up GEMV (RMSNorm in its prologue) and the down GEMV (SiLU·mul in its prologue, the residual
        add in its epilogue). A plain launch of either lets a PDL-launched kernel after it start early
        (``gemv.TRIGGER_NEXT``)."""
        if self.fused_mlp and h.shape[0] <= tm.MAX_ROWS:
            trigger = tg.TRIGGER_NEXT and not self.fused_mlp_pdl
            weight, eps = self.post_norm
            tm.fused_mlp(h, self.gate_up.weight, self.down.weight, weight, eps, pdl=self.fused_mlp_pdl, trigger=trigger)
            return
        gu = self.gate_up.norm_in(h, self.post_norm, self.pdl[2], self.gate_up_trigger)
        _add(self.down, gu, h, self.pdl[3], silu_mul=True)


def _add(proj: Projection, x: torch.Tensor, h: torch.Tensor, pdl: bool, silu_mul: bool = False) -> None:
    """``h += proj(x)`` in place, the residual add in the GEMV's epilogue, or the projection's own launch."""
    if proj.add_into is not None:
        proj.add_into(x, h, pdl, silu_mul)
    else:
        tg.gemv(x, proj.weight, proj.bias, silu_mul=silu_mul, residual=h, out=h, pdl=pdl)


def norm_of(norm: RMSNorm) -> tuple[torch.Tensor, float]:
    return norm.weight, norm.eps
