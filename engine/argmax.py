"""Row-wise argmax over a large vocabulary in two Triton launches.

Why: at batch 1 ``torch.argmax`` reduces the whole row in few thread blocks, which on a large
vocabulary is a measurable slice of a decode step. Splitting each row into chunks (stage 1:
max and index per chunk, many programs) and reducing the chunk winners (stage 2) reads the row at
full bandwidth. Ties go to the lowest index, as torch's do.
"""

from __future__ import annotations

from typing import Optional

import torch

try:
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except Exception:  # pragma: no cover - CPU builds of torch ship no triton
    HAVE_TRITON = False

CHUNK = 4096

if HAVE_TRITON:

    @triton.jit
    def _chunk_argmax(x_ptr, val_ptr, idx_ptr, V, x_stride, n_chunks, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        c = tl.program_id(1)
        cols = c * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * x_stride + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        m, i = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
        tl.store(val_ptr + row * n_chunks + c, m)
        tl.store(idx_ptr + row * n_chunks + c, (c * BLOCK + i).to(tl.int64))

    @triton.jit
    def _final_argmax(val_ptr, idx_ptr, out_ptr, n_chunks, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        c = tl.arange(0, BLOCK)
        v = tl.load(val_ptr + row * n_chunks + c, mask=c < n_chunks, other=float("-inf"))
        _, j = tl.max(v, axis=0, return_indices=True, return_indices_tie_break_left=True)
        tl.store(out_ptr + row, tl.load(idx_ptr + row * n_chunks + j))


def argmax_rows(logits: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``torch.argmax(logits, dim=-1)`` for a 2-D CUDA tensor (falls back to torch elsewhere), into
    ``out`` (int64, one per row) when given; a CUDA graph may capture it."""
    if not HAVE_TRITON or logits.device.type != "cuda" or logits.dim() != 2 or logits.stride(-1) != 1:
        top = torch.argmax(logits, dim=-1)
        return top if out is None else out.copy_(top)
    rows, V = logits.shape
    n_chunks = triton.cdiv(V, CHUNK)
    vals = torch.empty(rows, n_chunks, dtype=torch.float32, device=logits.device)
    idx = torch.empty(rows, n_chunks, dtype=torch.int64, device=logits.device)
    if out is None:
        out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    _chunk_argmax[(rows, n_chunks)](logits, vals, idx, V, logits.stride(0), n_chunks, BLOCK=CHUNK, num_warps=8)
    _final_argmax[(rows,)](vals, idx, out, n_chunks, BLOCK=triton.next_power_of_2(n_chunks))
    return out
