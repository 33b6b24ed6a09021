"""Row-wise argmax over a large vocabulary in two Triton launches.

Why: at batch 1 ``torch.argmax`` reduces the whole row in few thread blocks, which on a large
vocabulary is a measurable slice of a decode step. Splitting each row into chunks (stage 1:
max and index per chunk, many programs) and reducing the chunk winners (stage 2) reads the row at
full bandwidth. Ties go to the lowest index, as torch's do.

Stage 2 may also write each row's token into pinned host memory (``host_ring``: the row of a ring
that a device scalar picks): a decode graph's tokens then reach the host with the graph itself, with
no device-to-host copy queued between two replays (engine/step/overlap.py reads them after the step's
event).
"""

from __future__ import annotations

from typing import Optional

import torch

from .fused import cdiv, next_pow2

try:
    import triton
    import triton.language as tl

    from .launch import fast

    HAVE_TRITON = True
except Exception:  # pragma: no cover - CPU builds of torch ship no triton
    HAVE_TRITON = False

CHUNK = 4096

if HAVE_TRITON:

    @triton.jit
    def _chunk_argmax(x_ptr, val_ptr, idx_ptr, V, x_stride, n_chunks, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
        row = tl.program_id(0)
        c = tl.program_id(1)
        if USE_PDL:  # the logits come from the kernel before
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        cols = c * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * x_stride + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        m, i = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
        tl.store(val_ptr + row * n_chunks + c, m)
        tl.store(idx_ptr + row * n_chunks + c, (c * BLOCK + i).to(tl.int64))

    @triton.jit
    def _final_argmax(
        val_ptr,
        idx_ptr,
        out_ptr,
        host_ptr,
        slot_ptr,
        host_stride,
        n_chunks,
        BLOCK: tl.constexpr,
        HOST: tl.constexpr,
        USE_PDL: tl.constexpr,
    ):
        row = tl.program_id(0)
        c = tl.arange(0, BLOCK)
        if USE_PDL:  # the chunk winners come from the kernel before
            tl.extra.cuda.gdc_wait()
        v = tl.load(val_ptr + row * n_chunks + c, mask=c < n_chunks, other=float("-inf"))
        _, j = tl.max(v, axis=0, return_indices=True, return_indices_tie_break_left=True)
        token = tl.load(idx_ptr + row * n_chunks + j)
        tl.store(out_ptr + row, token)
        if HOST:  # pinned host memory, mapped into the device's address space
            tl.store(host_ptr + tl.load(slot_ptr).to(tl.int64) * host_stride + row, token)


def argmax_rows(
    logits: torch.Tensor,
    out: Optional[torch.Tensor] = None,
    host_ring: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
    pdl: bool = False,
) -> torch.Tensor:
    """``torch.argmax(logits, dim=-1)`` for a 2-D CUDA tensor (falls back to torch elsewhere), into
    ``out`` (int64, one per row) when given; a CUDA graph may capture it.

    ``host_ring``: (ring, slot), a pinned int64 [R, >= rows] host tensor and an int32 device scalar;
    the tokens are also written into ``ring[slot]`` (CUDA with Triton only: ``host_ring_supported``).
    ``pdl``: both launches with programmatic dependent launch (Hopper+; the caller's policy,
    ``DecoderForCausalLM.logits_pdl``): each may start while the kernel before it drains, which the
    lm_head GEMV allows (``gemv.gemv(trigger=True)``)."""
    if not host_ring_supported(logits):  # the Triton kernels' own conditions
        assert host_ring is None, "host_ring needs the Triton kernel"
        top = torch.argmax(logits, dim=-1)
        return top if out is None else out.copy_(top)
    rows, V = logits.shape
    n_chunks = cdiv(V, CHUNK)
    vals = torch.empty(rows, n_chunks, dtype=torch.float32, device=logits.device)
    idx = torch.empty(rows, n_chunks, dtype=torch.int64, device=logits.device)
    if out is None:
        out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    fast(_chunk_argmax)[(rows, n_chunks)](
        logits, vals, idx, V, logits.stride(0), n_chunks, BLOCK=CHUNK, USE_PDL=pdl, num_warps=8, launch_pdl=pdl
    )
    ring, slot = host_ring if host_ring is not None else (out, out)
    fast(_final_argmax)[(rows,)](
        vals,
        idx,
        out,
        ring,
        slot,
        ring.stride(0) if host_ring is not None else 0,
        n_chunks,
        BLOCK=next_pow2(n_chunks),
        HOST=host_ring is not None,
        USE_PDL=pdl,
        launch_pdl=pdl,
    )
    return out


def host_ring_supported(logits: torch.Tensor) -> bool:
    """Whether ``argmax_rows`` runs its Triton kernels on ``logits``, and so can write the row tokens
    straight to pinned host memory."""
    return HAVE_TRITON and logits.device.type == "cuda" and logits.dim() == 2 and logits.stride(-1) == 1
