"""Paged decode attention in one Triton kernel: split-KV with the merge done by the last split.

Why: at decode batch 1-8 with short contexts the attention of a layer reads well under a megabyte,
so its cost is launch latency and dependent loads, not bytes. FlashInfer's graph-mode decode spends
two launches per layer on it (the split-KV kernel, then a merge kernel: ~10.6 µs per layer on an
H200 for Qwen3-0.6B at bs 1, a quarter of the whole step). Here every (request, KV head, split)
program attends to its share of the context and writes a partial (running max, sum, output); the
program that finishes last for its (request, head) — an atomic ticket says which — merges the
partials and writes the output. One launch, every SM busy even at bs 1, and no host planning: the
kernel reads the same indptr / indices / last_page_len page lists FlashInfer uses.

Grid is (rows, KV heads, splits), fixed per graph bucket; splits with no tokens exit at once, so a
short context costs one split's work. The query heads of one KV head (the GQA group) are padded to
16 rows so both products run on tensor cores.

Status: correct (tests/test_cuda_kernels.py, tests/test_flashinfer_cuda.py) but not yet faster: on an
H200 at bs 1, context ~220, it took 12.5 µs per layer against FlashInfer's 8.2 + 2.4 µs, so it is
opt-in (``GRAPHTOP_FLASHINFER_DECODE=triton``). Likely costs: 64-token chunks leave most splits idle
at short contexts, and the last-split merge adds a dependent atomic + reload chain.
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

MAX_SPLITS = 16


def num_splits(rows: int, kv_heads: int, sms: int) -> int:
    """Enough programs for ~2 waves over the SMs, at most MAX_SPLITS, a power of two."""
    want = max(1, (2 * sms) // max(1, rows * kv_heads))
    return min(MAX_SPLITS, 1 << (want.bit_length() - 1))


if HAVE_TRITON:

    @triton.jit
    def _decode_kernel(q_ptr, k_ptr, v_ptr, indptr_ptr, indices_ptr, last_ptr, o_ptr,
                       po_ptr, pml_ptr, ticket_ptr, scale,
                       q_stride_b, q_stride_h, o_stride_b, o_stride_h, n_kv_heads,
                       PAGE: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr,
                       BLOCK_T: tl.constexpr, SPLITS: tl.constexpr):
        b = tl.program_id(0)
        hk = tl.program_id(1)
        s = tl.program_id(2)
        p0 = tl.load(indptr_ptr + b)
        p1 = tl.load(indptr_ptr + b + 1)
        seq = (p1 - p0 - 1) * PAGE + tl.load(last_ptr + b)
        chunk = tl.cdiv(tl.cdiv(seq, SPLITS), BLOCK_T) * BLOCK_T
        t_lo = s * chunk
        t_hi = tl.minimum(seq, t_lo + chunk)

        g = tl.arange(0, GP)
        d = tl.arange(0, D)
        gm = g < G
        heads = hk * G + g
        q = tl.load(q_ptr + b * q_stride_b + heads[:, None] * q_stride_h + d[None, :], mask=gm[:, None], other=0.0)
        slot_stride = n_kv_heads * D
        m_i = tl.full([GP], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([GP], dtype=tl.float32)
        acc = tl.zeros([GP, D], dtype=tl.float32)
        for t0 in range(t_lo, t_hi, BLOCK_T):
            t = t0 + tl.arange(0, BLOCK_T)
            tm = t < t_hi
            page = tl.load(indices_ptr + p0 + t // PAGE, mask=tm, other=0).to(tl.int64)
            off = (page * PAGE + t % PAGE) * slot_stride + hk * D
            k = tl.load(k_ptr + off[:, None] + d[None, :], mask=tm[:, None], other=0.0)
            v = tl.load(v_ptr + off[:, None] + d[None, :], mask=tm[:, None], other=0.0)
            sc = tl.dot(q, tl.trans(k)) * scale
            sc = tl.where(tm[None, :], sc, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(sc, axis=1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(sc - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new

        o_rows = o_ptr + b * o_stride_b + heads[:, None] * o_stride_h + d[None, :]
        if SPLITS == 1:
            tl.store(o_rows, (acc / l_i[:, None]).to(o_ptr.dtype.element_ty), mask=gm[:, None])
        else:
            bh = b * n_kv_heads + hk
            part = (bh * SPLITS + s) * GP
            tl.store(po_ptr + (part + g)[:, None] * D + d[None, :], acc)
            tl.store(pml_ptr + (part + g) * 2, m_i)
            tl.store(pml_ptr + (part + g) * 2 + 1, l_i)
            # acq_rel: our partials are visible to whoever draws the last ticket, and theirs to us.
            ticket = tl.atomic_add(ticket_ptr + bh, 1)
            if ticket == SPLITS - 1:
                sp = tl.arange(0, SPLITS)
                rows = (bh * SPLITS + sp)[:, None] * GP + g[None, :]  # [SPLITS, GP]
                ms = tl.load(pml_ptr + rows * 2, cache_modifier=".cg")
                ls = tl.load(pml_ptr + rows * 2 + 1, cache_modifier=".cg")
                mx = tl.max(ms, axis=0)
                w = tl.exp(ms - mx[None, :])  # empty splits: exp(-inf) = 0
                den = tl.sum(w * ls, axis=0)
                po = tl.load(po_ptr + rows[:, :, None] * D + d[None, None, :], cache_modifier=".cg")
                out = tl.sum(w[:, :, None] * po, axis=0) / den[:, None]
                tl.store(o_rows, out.to(o_ptr.dtype.element_ty), mask=gm[:, None])
                tl.store(ticket_ptr + bh, 0)  # ready for the next layer / replay


class PagedDecode:
    """Workspace and launch for ``_decode_kernel``; one per backend, shared by every layer and bucket.

    Tensors it is given at ``run`` may be graph-static buffers: nothing is allocated per call except
    the output, so it captures in a CUDA graph as is.
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, page_size: int, scale: float,
                 max_rows: int, device: torch.device) -> None:
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.group = num_heads // num_kv_heads
        self.group_pad = max(16, triton.next_power_of_2(self.group))
        self.page_size, self.scale, self.device = page_size, scale, device
        self.sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132
        self._alloc(max_rows)

    def _alloc(self, rows: int) -> None:
        # Captured graphs keep pointing at the buffers they were captured with: keep those alive.
        if hasattr(self, "_po"):
            self._retired.append((self._po, self._pml, self._tickets))
        else:
            self._retired: list[tuple[torch.Tensor, ...]] = []
        self.max_rows = rows
        parts = rows * self.num_kv_heads * MAX_SPLITS * self.group_pad
        self._po = torch.empty(parts * self.head_dim, dtype=torch.float32, device=self.device)
        self._pml = torch.empty(parts * 2, dtype=torch.float32, device=self.device)
        self._tickets = torch.zeros(rows * self.num_kv_heads, dtype=torch.int32, device=self.device)

    def run(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, indptr: torch.Tensor,
            indices: torch.Tensor, last_page_len: torch.Tensor, out: Optional[torch.Tensor] = None,
            splits: Optional[int] = None) -> torch.Tensor:
        """q [rows, H, D]; caches with contiguous slots (any [pages, page, Hkv, D] / [slots, Hkv, D] view)."""
        rows = q.shape[0]
        if rows > self.max_rows:
            self._alloc(rows)  # outside graphs only: buckets never exceed the size given at init
        if out is None:
            out = torch.empty_like(q)
        splits = splits or num_splits(rows, self.num_kv_heads, self.sms)
        _decode_kernel[(rows, self.num_kv_heads, splits)](
            q, k_cache, v_cache, indptr, indices, last_page_len, out, self._po, self._pml, self._tickets,
            self.scale, q.stride(0), q.stride(1), out.stride(0), out.stride(1), self.num_kv_heads,
            PAGE=self.page_size, G=self.group, GP=self.group_pad, D=self.head_dim,
            BLOCK_T=64 if self.head_dim <= 128 else 32, SPLITS=splits, num_warps=4, num_stages=2,
        )
        return out
