"""The gated MLP, numerically identical to the HF modules it replaces (RMSNorm: ``norm.py``).

down(act(gate(x)) * up(x)): SwiGLU with SiLU (Llama, Mistral, Qwen, Phi-3), GeGLU with GELU (Gemma). The
activation is the config's, by transformers' name; the fused Triton path implements SiLU alone
(``FUSED_ACTIVATIONS``), and a model with another activation runs on these torch layers instead
(``layers/fused_support.py``).
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
}
"""transformers' activation names (``ACT2FN``) this MLP runs, each as transformers computes it."""
FUSED_ACTIVATIONS = ("silu", "swish")
"""The activations the fused kernels' SiLU·mul implements."""


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)), names as in HF checkpoints."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool, act: str = "silu") -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)
        self.act = ACTIVATIONS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))

    @torch.no_grad()
    def fuse(self) -> None:
        """gate and up as one GEMM ``gate_up_proj`` ([gate | up] rows) for the fused-kernel path."""
        w = torch.cat([self.gate_proj.weight, self.up_proj.weight])
        self.gate_up_proj = nn.Linear(
            w.shape[1], w.shape[0], bias=self.gate_proj.bias is not None, device=w.device, dtype=w.dtype
        )
        self.gate_up_proj.weight.copy_(w)
        if self.gate_proj.bias is not None:
            self.gate_up_proj.bias.copy_(torch.cat([self.gate_proj.bias, self.up_proj.bias]))
        del self.gate_proj, self.up_proj
        self.gate_up_proj.requires_grad_(False)
