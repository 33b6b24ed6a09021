"""The experts on the torch ops (CPU, and wherever the grouped GEMM does not run): tokens sorted by expert,
one pair of matmuls per expert that any token chose.

The (token, slot) pairs are sorted by expert once; each active expert then multiplies its contiguous run of
rows, weights them and adds them into the output with ``index_add_``, experts in ascending order. That is
transformers' order of operations (its loop over the experts hit, gate and up as one matmul of the stacked
rows), so fp32 logits agree with it to rounding of the matmuls alone. Which experts are active is read on
the host (one sync a layer): this path serves eager forwards and emulated graphs, not a CUDA capture.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F


def sorted_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    act: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """sum over k of weights[t, k] * expert_{ids[t, k]}(x[t]) for every row t of ``x`` [T, H]; ``w13`` [E, 2I, H]
    (gate rows, then up rows), ``w2`` [E, H, I]; ``weights``, ``ids`` [T, k]."""
    k = ids.shape[1]
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=w13.shape[0]).tolist()
    tokens = order // k
    scale = weights.reshape(-1)[order]
    out = torch.zeros_like(x)
    start = 0
    for expert, n in enumerate(counts):
        if n == 0:
            continue
        rows = slice(start, start + n)
        start += n
        tok = tokens[rows]
        gate, up = F.linear(x[tok], w13[expert]).chunk(2, dim=-1)
        y = F.linear(act(gate) * up, w2[expert]) * scale[rows, None]
        out.index_add_(0, tok, y.to(out.dtype))
    return out
