"""Weights into L2 before the PDL wait: a decode kernel launched with programmatic dependent launch asks
the L2 for its whole share of a weight matrix (``cp.async.bulk.prefetch.L2``, Hopper) before it waits
for its predecessor, then reads it from L2 after the wait.

Why: some kernels of a decode step leave HBM idle while they run. The decode attention after q|k|v
reads a few hundred KiB of K/V at small batches and is bound by latency, not bytes; the o projection
after it then streams 32 MiB (Llama-3.1-8B) from a cold start. Launched early with PDL, the o
projection's programs sit at their wait during the attention; until now they requested only their
first weight tile there (into registers), so most of o's bytes started moving only after the
attention had finished. A prefetch of the rest into L2 keeps HBM busy through the attention. Kernels
whose predecessor streams at full bandwidth gain nothing (the bytes compete) and do not prefetch:
``PROJECTIONS`` says which do, ``bench/ab_decode.py``'s ``l2=`` variant measures others.

A prefetch is a hint (no result, no fault on the addresses given: callers pass rows inside the
tensor), so it changes no result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .triton_kernels import HAVE_TRITON

if TYPE_CHECKING:
    import torch

#: the decoder projections ("qkv", "o", "gate_up", "down") whose PDL-launched kernels (fused GEMV at one
#: row, skinny GEMM at 2-64) prefetch their weight share into L2 before the wait
PROJECTIONS: frozenset[str] = frozenset()

NAMES = ("qkv", "o", "gate_up", "down")
"""The order ``DecoderLayer`` keeps its per-projection switches in."""


def flags() -> tuple[bool, ...]:
    """``PROJECTIONS`` as one switch per projection, in ``NAMES`` order."""
    return tuple(name in PROJECTIONS for name in NAMES)


def fits(weight: "torch.Tensor", row_len: int) -> bool:
    """Whether a program's share of ``weight`` (rows of ``row_len`` elements from a multiple of
    ``row_len``) is whole 16-byte units from a 16-byte aligned start, as the bulk prefetch needs."""
    return (row_len * weight.element_size()) % 16 == 0 and weight.data_ptr() % 16 == 0


if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _prefetch(ptr, nbytes):
        """Ask L2 for ``nbytes`` (a multiple of 16) from ``ptr`` (16-byte aligned), asynchronously; warp
        0 issues it (every thread holds the scalar: one request, not one per warp)."""
        tl.inline_asm_elementwise(
            "{\n\t.reg .pred p;\n\t.reg .u32 t;\n\tmov.u32 t, %tid.x;\n\tsetp.lt.u32 p, t, 32;\n\t"
            "@p cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;\n\t}",
            "=r,l,r", [ptr, nbytes], dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def prefetch_rows_l2(ptr, rows, row_stride, row_len):
        """``rows`` rows of ``row_len`` elements from ``ptr``, ``row_stride`` elements apart, into L2: one
        request where they are contiguous (a program's whole slab of a weight), else one per row (its
        K share of each row). Byte counts and addresses must be multiples of 16 (the caller checks)."""
        nb = ptr.dtype.element_ty.primitive_bitwidth // 8
        if row_len == row_stride:
            _prefetch(ptr, rows * row_len * nb)
        else:
            for r in range(rows):
                _prefetch(ptr + r.to(tl.int64) * row_stride, row_len * nb)

    @triton.jit
    def prefetch_each_l2(ptrs, nbytes):
        """Ask L2 for ``nbytes`` (a multiple of 16) from every pointer of ``ptrs`` (16-byte aligned;
        scattered rows, such as a context's K/V rows through its page list): each thread its own."""
        tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;", "=r,l,r",
                                  [ptrs, nbytes + tl.zeros(ptrs.shape, tl.int32)], dtype=tl.int32,
                                  is_pure=False, pack=1)
