"""The merge of a split decode's partials (models/kernels/decode_attention.py), a Triton function of its own
module so the kernel's file stays readable."""

from __future__ import annotations

try:
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except Exception:  # pragma: no cover - CPU builds of torch ship no triton
    HAVE_TRITON = False


if HAVE_TRITON:

    @triton.jit
    def _merge_splits(
        po_ptr,
        pml_ptr,
        first,
        g,
        gm,
        d,
        n_act,
        G: tl.constexpr,
        GP: tl.constexpr,
        D: tl.constexpr,
        SPLITS: tl.constexpr,
    ):
        """Every query head's output [GP, D] from its splits' partials (rows ``first + s * G + g``), an
        online softmax over the splits in split order. Unrolled over SPLITS with the inactive ones
        masked, it has no cross-thread reduction and stores nothing between its loads, so they can all
        be in flight at once: merging one head after another waited for each head's loads, reductions
        and store in turn, and a split cost several times its bytes (bench/decode_attn_bench.py,
        bench/ab_decode.py; docs/benchmarks.md)."""
        m = tl.full([GP], float("-inf"), dtype=tl.float32)
        den = tl.zeros([GP], dtype=tl.float32)
        acc = tl.zeros([GP, D], dtype=tl.float32)
        for s in tl.static_range(SPLITS):
            live = gm & (tl.full([GP], s, tl.int32) < n_act)
            row = first + s * G + g
            ms = tl.load(pml_ptr + row * 2, mask=live, other=float("-inf"), cache_modifier=".cg")
            ls = tl.load(pml_ptr + row * 2 + 1, mask=live, other=0.0, cache_modifier=".cg")
            po = tl.load(po_ptr + row[:, None] * D + d[None, :], mask=live[:, None], other=0.0, cache_modifier=".cg")
            ms = tl.where(gm, ms, 0.0)  # padded query rows: finite, never stored
            m_new = tl.maximum(m, ms)
            keep = tl.exp(m - m_new)  # split 0 is always live: m_new is finite from it on
            take = tl.exp(ms - m_new)  # an inactive split: exp(-inf) = 0
            den = den * keep + ls * take
            acc = acc * keep[:, None] + po * take[:, None]
            m = m_new
        return acc / den[:, None]
