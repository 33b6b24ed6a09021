"""SiLU·mul (silu(gate) * up, the SwiGLU activation) on the fused path, where it is no projection's
prologue or epilogue: its own kernel after a gate|up projection (cuBLAS, or the plain skinny GEMM at a
row class whose fused SiLU·mul epilogue measured slower). HF's rounding points: SiLU rounded to the
activation dtype, then the product. The torch path keeps ``act(gate) * up`` (``GatedMLP``)."""

from __future__ import annotations

import torch

from ..kernels import fused as tk


def silu_mul_pdl(projection_pdl: bool) -> bool:
    """Whether the SiLU·mul kernel launches with PDL: when the skinny projections around it do (the down
    projection after it may then request its first weight tiles while it runs), unless switched off
    (``fused.SILU_MUL_PDL``; bench/ab_decode.py silu_pdl=off)."""
    return projection_pdl and tk.SILU_MUL_PDL


def silu_and_mul(gate_up: torch.Tensor, pdl: bool) -> torch.Tensor:
    """[gate | up] rows [N, 2I] -> silu(gate) * up [N, I], one launch."""
    return tk.silu_and_mul(gate_up, pdl)
