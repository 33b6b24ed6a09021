"""What the fused attention entry takes: one layer's fused q|k|v projection and what turns it into the
attention's q, k and v. One record from the model (``Attention.attend_fused``) through the engine's
backend (``forward_qkv``) to the kernel (``PagedDecode.run_qkv``), so its six values are named once.

A NamedTuple, not a dataclass: the model builds one per layer per eager step, and a tuple costs the least
host time to make."""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch


class QKVInput(NamedTuple):
    """``qkv`` [T, (H + 2 Hkv) * D]; q/k RMSNorm by ``q_norm``/``k_norm`` weights with ``eps`` (None: no
    q/k norm), then NeoX RoPE of ``positions`` from ``cos_sin_cache``."""

    qkv: torch.Tensor
    positions: torch.Tensor
    cos_sin_cache: torch.Tensor
    q_norm: Optional[torch.Tensor] = None
    k_norm: Optional[torch.Tensor] = None
    eps: float = 0.0
