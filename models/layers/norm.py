"""RMSNorm (Llama's, and Gemma's (1 + w) form), and where the fused path runs the decoder's RMSNorms.

The module is HF's op order exactly (CPU and fp32 parity tests compare logits bit for bit). On the fused
path (CUDA bf16/fp16 with Triton) a norm runs as one kernel, its residual add fused in
(models/kernels/fused.py), or rides in the skinny projection after it as a per-row scale of its sums
(``NormInput``: the producer's slab partials of the rows' squares, the norm's weight folded into the
projection's, ``fold_norm``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..kernels import fused as tk
from ..kernels import skinny as ts


class RMSNorm(nn.Module):
    """Normalise in float32, cast back, then scale: the exact HF op order (matters in bf16)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class OffsetRMSNorm(nn.Module):
    """Gemma's RMSNorm: scaled by (1 + weight), in float32, then cast: transformers' op order for Gemma, whose
    stored weights are offsets from one (a zero weight is the identity scale)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)


@dataclass(frozen=True)
class PreNorm:
    """The residual stream before the final RMSNorm: ``residual``, plus ``x``, a last sublayer output not
    yet added to it (the fused path's stream), or, where the last down projection added into it on the
    skinny GEMM, ``sumsq``, its rows' squares as slab partials (``skinny.NormInput``: a skinny lm_head then
    normalises in its own epilogue)."""

    residual: torch.Tensor
    x: torch.Tensor | None = None
    sumsq: torch.Tensor | None = None


def fused_input_norm(
    x: torch.Tensor | None, residual: torch.Tensor | None, sumsq: torch.Tensor | None, ln: RMSNorm, pdl: bool
) -> tuple[torch.Tensor, torch.Tensor, ts.NormInput | None]:
    """A fused layer's input RMSNorm over the stream (x, residual, sumsq) (``DecoderLayer.forward_fused``):
    (h, residual, norm), h the q|k|v projection's input. The first layer's embeddings (``residual`` None)
    take the RMSNorm kernel, a pending ``x`` the add+RMSNorm kernel (``pdl``: the skinny GEMM's launch
    policy); where the last down projection already summed the residual (``sumsq``), h is the residual and
    ``norm`` the per-row scale the q|k|v projection applies to its sums."""
    if sumsq is not None:
        assert residual is not None
        h, norm = residual, ts.NormInput(sumsq, ln.eps)
    elif residual is None:
        residual, h, norm = x, tk.rms_norm(x, ln.weight, ln.eps), None
    else:
        h, norm = tk.add_rms_norm(x, residual, ln.weight, ln.eps, pdl), None
    return h, residual, norm


def add_norm(x: torch.Tensor, residual: torch.Tensor, norm: RMSNorm, pdl: bool = False) -> torch.Tensor:
    """``residual += x`` in place, then RMSNorm(residual): the fused path's add+RMSNorm kernel."""
    return tk.add_rms_norm(x, residual, norm.weight, norm.eps, pdl)


def final_norm(norm: RMSNorm, pre: PreNorm, fused: bool) -> torch.Tensor:
    """The final RMSNorm of ``pre`` (after its pending add), by the path that produced it."""
    if not fused:
        assert pre.x is None
        return norm(pre.residual)
    if pre.x is None:  # the last down projection added into the residual already
        return tk.rms_norm(pre.residual, norm.weight, norm.eps)
    return add_norm(pre.x, pre.residual, norm)


@torch.no_grad()
def fold_norm(norm: RMSNorm, proj: nn.Linear) -> None:
    """Fold ``norm``'s weight into the projection after it (its input columns), leaving the norm's weight
    at one, so the projection can take RMSNorm(x) as x times a per-row scale applied to its sums
    (``skinny.NormInput``): the skinny GEMM's K loop stays the plain one. Every fused path (GEMV, skinny,
    cuBLAS) runs on the folded weights, so their numerics agree with each other; against HF's bf16 the
    rounding moves from the normalised activations to the weights (one bf16 rounding of W * w instead of
    one of w * x), an ulp-level change of the same size."""
    proj.weight.mul_(norm.weight.to(proj.weight.dtype)[None, :])
    norm.weight.fill_(1.0)
