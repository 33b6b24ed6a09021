"""Paged decode attention in one Triton launch per layer: q/k-norm, RoPE, the K/V store, split-KV
attention and the merge of the splits.

Why: at decode batch 1-64 with short contexts a layer's attention reads well under a megabyte, so
its cost is launch latency and chains of dependent loads, not bytes. The FlashInfer path spends four
launches on it (q/k-norm+RoPE, K/V store, FlashInfer's split-KV decode, its merge). Here every
(request, KV head, split) program attends to its share of the context; the step's own token comes
straight from the fused q|k|v projection (normalised and rotated in registers, stored to the cache by
split 0, which also attends to it), so nothing waits for a store. A context of at most
``min_chunk`` tokens stays in one program: no partials, no merge. Longer ones split; the program that
finishes last for its (request, head) — an atomic ticket says which — merges the partials. No host
planning: the kernel reads the same indptr / indices / last_page_len page lists FlashInfer uses.

Grid is (rows, KV heads, splits), fixed per graph bucket; splits past the context exit at once. The
query heads of one KV head (the GQA group) are padded to 16 rows so both products run on tensor cores.
With programmatic dependent launch a program requests its first K/V tile (those cache rows were written
by earlier steps), its row's RoPE table entry and the q/k-norm weights before waiting for the
projection, so they stream while the projection drains and only q|k|v itself is read after the wait.

It beats FlashInfer's four launches from bs 1 to 64 on both benchmark shapes, and at bs 256 on the
Llama-3.1-8B shape (GQA group 4), but loses at bs 256 on the Qwen3-0.6B shape (group 2); the choice is
``triton_rows_for`` (engine/attention/decode_policy.py); figures in docs/benchmarks.md.
"""

from __future__ import annotations

from typing import Optional

import torch

from graphtop.models.kernels.fused import sm_count, use_pdl

from .decode_attention_tuning import HUGE_ROWS, LARGE_ROWS, DecodeTuning, num_splits, shipped_tunings
from .qkv_input import QKVInput

try:
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except Exception:  # pragma: no cover - CPU builds of torch ship no triton
    HAVE_TRITON = False


if HAVE_TRITON:
    from graphtop.models.kernels.decode_attention_merge import _merge_splits
    from graphtop.models.kernels.fused import rms_scale
    from graphtop.models.kernels.launch import fast

    @triton.jit
    def _kv_tile(
        k_ptr,
        v_ptr,
        indices_ptr,
        p0,
        t0,
        t_hi,
        hk,
        slot_stride,
        d,
        PAGE: tl.constexpr,
        D: tl.constexpr,
        BLOCK_T: tl.constexpr,
    ):
        """K and V rows t0 .. t0 + BLOCK_T of one KV head, through the page list; rows at or past
        ``t_hi`` are masked (zero, no memory traffic)."""
        t = t0 + tl.arange(0, BLOCK_T)
        tm = t < t_hi
        page = tl.load(indices_ptr + p0 + t // PAGE, mask=tm, other=0).to(tl.int64)
        off = (page * PAGE + t % PAGE) * slot_stride + hk * D
        k = tl.load(k_ptr + off[:, None] + d[None, :], mask=tm[:, None], other=0.0)
        v = tl.load(v_ptr + off[:, None] + d[None, :], mask=tm[:, None], other=0.0)
        return k, v

    @triton.jit
    def _attend_tile(q, k, v, t0, t_hi, m_i, l_i, acc, scale, BLOCK_T: tl.constexpr):
        """One tile of online softmax: the running max, sum and output after rows t0 .. t0 + BLOCK_T."""
        tm = t0 + tl.arange(0, BLOCK_T) < t_hi
        sc = tl.dot(q, tl.trans(k)) * scale
        sc = tl.where(tm[None, :], sc, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(sc - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        return m_new, l_i, acc

    @triton.jit
    def _rope_inputs(pos_ptr, cs_ptr, qw_ptr, kw_ptr, b, d, dsw, dt, D: tl.constexpr, HAS_NORM: tl.constexpr):
        """Row b's cos and signed sin (-sin on the first half, +sin on the second) in fp32 after rounding
        to the activation dtype, and the q/k-norm weights at each lane and its partner (fp32; ones
        without a norm). Nothing here is written by a kernel of the step."""
        pos = tl.load(pos_ptr + b)
        cf = tl.load(cs_ptr + pos * D + d % (D // 2)).to(dt).to(tl.float32)
        sf = tl.load(cs_ptr + pos * D + D // 2 + d % (D // 2)).to(dt).to(tl.float32)
        sf = tl.where(d < D // 2, -sf, sf)
        if HAS_NORM:
            qw = tl.load(qw_ptr + d).to(tl.float32)
            qwsw = tl.load(qw_ptr + dsw).to(tl.float32)
            kw = tl.load(kw_ptr + d).to(tl.float32)
            kwsw = tl.load(kw_ptr + dsw).to(tl.float32)
        else:
            qw = tl.full([D], 1.0, tl.float32)
            qwsw = qw
            kw = qw
            kwsw = qw
        return cf, sf, qw, qwsw, kw, kwsw

    @triton.jit
    def _decode_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        indptr_ptr,
        indices_ptr,
        last_ptr,
        o_ptr,
        po_ptr,
        pml_ptr,
        ticket_ptr,
        scale,
        q_stride_b,
        q_stride_h,
        o_stride_b,
        o_stride_h,
        n_kv_heads,
        kn_ptr,
        vn_ptr,
        new_stride_b,
        pos_ptr,
        cs_ptr,
        qw_ptr,
        kw_ptr,
        eps,
        window,
        PAGE: tl.constexpr,
        G: tl.constexpr,
        GP: tl.constexpr,
        D: tl.constexpr,
        BLOCK_T: tl.constexpr,
        MIN_CHUNK: tl.constexpr,
        SPLITS: tl.constexpr,
        NEW_KV: tl.constexpr,
        HAS_NORM: tl.constexpr,
        USE_PDL: tl.constexpr,
        PREFETCH: tl.constexpr,
    ):
        b = tl.program_id(0)
        hk = tl.program_id(1)
        s = tl.program_id(2)
        # the page lists came from the host before the graph: readable before the PDL wait
        p0 = tl.load(indptr_ptr + b)
        p1 = tl.load(indptr_ptr + b + 1)
        last = tl.load(last_ptr + b)
        seq = (p1 - p0 - 1) * PAGE + last
        if NEW_KV:
            n_ctx = seq - 1  # the step's own token comes from registers, not the cache
        else:
            n_ctx = seq
        # a sliding window of ``window`` keys (the query's own included; 0: none) starts at seq - window: the
        # row's start follows its length, read from the page lists, so a graph's replay windows the live batch
        start = tl.where(window > 0, tl.maximum(seq - window, 0), 0)
        chunk = tl.maximum(MIN_CHUNK, tl.cdiv(tl.cdiv(n_ctx - start, SPLITS), BLOCK_T) * BLOCK_T)
        n_act = tl.maximum(1, tl.cdiv(n_ctx - start, chunk))
        d = tl.arange(0, D)
        slot_stride = n_kv_heads * D
        t_lo = start + s * chunk
        t_hi = tl.minimum(n_ctx, t_lo + chunk)
        dsw = (d + D // 2) % D  # the RoPE partner of each lane: the two halves swapped
        dt = q_ptr.dtype.element_ty
        # With the step's K/V coming from registers (NEW_KV), the cache rows a program reads were all
        # written by earlier steps, so its first tile is requested before the PDL wait and arrives while
        # the q|k|v projection still runs. Otherwise the step's own row was stored by the kernel before.
        if PREFETCH >= 1 and NEW_KV:
            k, v = _kv_tile(k_ptr, v_ptr, indices_ptr, p0, t_lo, t_hi, hk, slot_stride, d, PAGE, D, BLOCK_T)
        if PREFETCH >= 2 and NEW_KV:  # the position came from the host, the tables are weights
            cf, sf, qw, qwsw, kw, kwsw = _rope_inputs(pos_ptr, cs_ptr, qw_ptr, kw_ptr, b, d, dsw, dt, D, HAS_NORM)
        if USE_PDL:  # q, k, v (and, without NEW_KV, the step's cache row) come from the last kernel
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        if not (PREFETCH >= 1 and NEW_KV):
            k, v = _kv_tile(k_ptr, v_ptr, indices_ptr, p0, t_lo, t_hi, hk, slot_stride, d, PAGE, D, BLOCK_T)
        if s < n_act:
            g = tl.arange(0, GP)
            gm = g < G
            heads = hk * G + g
            q_rows = q_ptr + b * q_stride_b + heads[:, None] * q_stride_h
            q = tl.load(q_rows + d[None, :], mask=gm[:, None], other=0.0)
            if NEW_KV:
                # q/k RMSNorm (Qwen3) and NeoX RoPE with the rounding points of _qk_norm_rope_kernel.
                # Rotation as x * cos + swap(x) * (-sin | +sin): swap exchanges the two halves.
                if PREFETCH < 2:
                    cf, sf, qw, qwsw, kw, kwsw = _rope_inputs(
                        pos_ptr, cs_ptr, qw_ptr, kw_ptr, b, d, dsw, dt, D, HAS_NORM
                    )
                a = q.to(tl.float32)
                asw = tl.load(q_rows + dsw[None, :], mask=gm[:, None], other=0.0).to(tl.float32)
                k_row = kn_ptr + b * new_stride_b + hk * D
                ka = tl.load(k_row + d).to(tl.float32)
                kasw = tl.load(k_row + dsw).to(tl.float32)
                if HAS_NORM:
                    rq = tl.rsqrt(tl.sum(a * a, axis=1) / D + eps)[:, None]
                    a = rms_scale(a, rq, qw[None, :], dt)
                    asw = rms_scale(asw, rq, qwsw[None, :], dt)
                    rk = tl.rsqrt(tl.sum(ka * ka, axis=0) / D + eps)
                    ka = rms_scale(ka, rk, kw, dt)
                    kasw = rms_scale(kasw, rk, kwsw, dt)
                q = (a * cf[None, :] + asw * sf[None, :]).to(dt)
                k_new = (ka * cf + kasw * sf).to(dt)
                v_new = tl.load(vn_ptr + b * new_stride_b + hk * D + d)
                first = s == 0
                if first:  # the step's K/V go to the cache once, by the split that also attends to them
                    slot = tl.load(indices_ptr + p1 - 1).to(tl.int64) * PAGE + last - 1
                    tl.store(k_ptr + slot * slot_stride + hk * D + d, k_new)
                    tl.store(v_ptr + slot * slot_stride + hk * D + d, v_new)
                s_new = tl.sum(q.to(tl.float32) * k_new.to(tl.float32)[None, :], axis=1) * scale
                m_i = tl.where(first, s_new, float("-inf"))
                l_i = tl.where(first, 1.0, 0.0) + tl.zeros([GP], dtype=tl.float32)
                acc = tl.where(first, 1.0, 0.0) * v_new.to(tl.float32)[None, :] + tl.zeros([GP, D], dtype=tl.float32)
            else:
                m_i = tl.full([GP], float("-inf"), dtype=tl.float32)
                l_i = tl.zeros([GP], dtype=tl.float32)
                acc = tl.zeros([GP, D], dtype=tl.float32)
            if t_lo < t_hi:  # the first tile, loaded above
                m_i, l_i, acc = _attend_tile(q, k, v, t_lo, t_hi, m_i, l_i, acc, scale, BLOCK_T)
            for t0 in range(t_lo + BLOCK_T, t_hi, BLOCK_T):  # the rest, as Triton pipelines them
                k, v = _kv_tile(k_ptr, v_ptr, indices_ptr, p0, t0, t_hi, hk, slot_stride, d, PAGE, D, BLOCK_T)
                m_i, l_i, acc = _attend_tile(q, k, v, t0, t_hi, m_i, l_i, acc, scale, BLOCK_T)

            o_rows = o_ptr + b * o_stride_b + heads[:, None] * o_stride_h + d[None, :]
            if n_act == 1:
                tl.store(o_rows, (acc / l_i[:, None]).to(o_ptr.dtype.element_ty), mask=gm[:, None])
            else:
                bh = b * n_kv_heads + hk
                part = (bh * SPLITS + s) * G
                tl.store(po_ptr + (part + g)[:, None] * D + d[None, :], acc, mask=gm[:, None])
                tl.store(pml_ptr + (part + g) * 2, m_i, mask=gm)
                tl.store(pml_ptr + (part + g) * 2 + 1, l_i, mask=gm)
                # every thread's partials written before one thread's acq_rel ticket publishes them
                tl.debug_barrier()
                ticket = tl.atomic_add(ticket_ptr + bh, 1)
                if ticket == n_act - 1:
                    out = _merge_splits(po_ptr, pml_ptr, bh * SPLITS * G, g, gm, d, n_act, G, GP, D, SPLITS)
                    tl.store(o_rows, out.to(o_ptr.dtype.element_ty), mask=gm[:, None])
                    tl.store(ticket_ptr + bh, 0)  # ready for the next layer / replay


class PagedDecode:
    """Workspace and launch for ``_decode_kernel``; one per backend, shared by every layer and bucket.

    Tensors it is given at ``run`` may be graph-static buffers: nothing is allocated per call except
    the output, so it captures in a CUDA graph as is.
    """

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        scale: float,
        max_rows: int,
        device: torch.device,
        tuning: Optional[DecodeTuning] = None,
        pdl: Optional[bool] = None,
    ) -> None:
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.group = num_heads // num_kv_heads
        self.group_pad = max(16, triton.next_power_of_2(self.group))
        self.page_size, self.scale, self.device = page_size, scale, device
        self.sms = sm_count(torch.device(device))
        shipped = shipped_tunings(self.group, head_dim)
        self.tuning, self.one_row_tuning, self.large_tuning, self.huge_tuning = (tuning or t for t in shipped)
        self.pdl = use_pdl(torch.device(device)) if pdl is None else pdl
        self._retired: list[tuple[torch.Tensor, ...]] = []
        self._parts = self._rows = -1
        # partials only exist where a launch splits: batches big enough for one split fill the GPU alone
        worst = max((r * self.splits_for(r) for r in range(1, max_rows + 1) if self.splits_for(r) > 1), default=0)
        self._ensure(max_rows, worst * num_kv_heads * self.group)

    def tuning_for(self, rows: int) -> DecodeTuning:
        """The launch shape of a ``rows``-row launch (one given to the constructor is used for all)."""
        if rows >= HUGE_ROWS:
            return self.huge_tuning
        if rows == 1:
            return self.one_row_tuning
        return self.large_tuning if rows >= LARGE_ROWS else self.tuning

    def splits_for(self, rows: int) -> int:
        """How many programs share one (row, KV head)'s context in a launch of ``rows`` rows."""
        return num_splits(rows, self.num_kv_heads, self.sms, self.tuning_for(rows).waves)

    def _ensure(self, rows: int, parts: int) -> None:
        """Workspace for ``rows`` rows and ``parts`` partial rows; grown outside graphs only (buckets
        never exceed what ``__init__`` sized), and captured graphs keep the buffers they were given."""
        if rows <= self._rows and parts <= self._parts:
            return
        if self._rows >= 0:
            self._retired.append((self._po, self._pml, self._tickets))
        self._rows, self._parts = max(rows, self._rows), max(parts, self._parts)
        self._po = torch.empty(max(1, self._parts) * self.head_dim, dtype=torch.float32, device=self.device)
        self._pml = torch.empty(max(1, self._parts) * 2, dtype=torch.float32, device=self.device)
        self._tickets = torch.zeros(self._rows * self.num_kv_heads, dtype=torch.int32, device=self.device)

    def _launch(
        self,
        q: torch.Tensor,
        q_stride_b: int,
        q_stride_h: int,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        pages: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        out: Optional[torch.Tensor],
        splits: Optional[int],
        new: tuple,
        window: int = 0,
    ) -> torch.Tensor:
        rows = q.shape[0]
        splits = splits or self.splits_for(rows)
        self._ensure(rows, rows * self.num_kv_heads * splits * self.group if splits > 1 else 0)
        if out is None:
            out = torch.empty((rows, self.num_heads, self.head_dim), dtype=q.dtype, device=q.device)
        kn, vn, new_stride, pos, cs, qw, kw, eps, new_kv, has_norm = new
        tu = self.tuning_for(rows)
        fast(_decode_kernel)[(rows, self.num_kv_heads, splits)](
            q,
            k_cache,
            v_cache,
            *pages,
            out,
            self._po,
            self._pml,
            self._tickets,
            self.scale,
            q_stride_b,
            q_stride_h,
            out.stride(0),
            out.stride(1),
            self.num_kv_heads,
            kn,
            vn,
            new_stride,
            pos,
            cs,
            qw,
            kw,
            eps,
            window,
            PAGE=self.page_size,
            G=self.group,
            GP=self.group_pad,
            D=self.head_dim,
            BLOCK_T=tu.block_t,
            MIN_CHUNK=tu.min_chunk,
            SPLITS=splits,
            NEW_KV=new_kv,
            HAS_NORM=has_norm,
            USE_PDL=self.pdl,
            PREFETCH=tu.prefetch,
            num_warps=tu.num_warps,
            num_stages=tu.num_stages,
            launch_pdl=self.pdl,
            **({"maxnreg": tu.maxnreg} if tu.maxnreg else {}),
        )
        return out

    def run(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        last_page_len: torch.Tensor,
        out: Optional[torch.Tensor] = None,
        splits: Optional[int] = None,
        window: int = 0,
    ) -> torch.Tensor:
        """q [rows, H, D] over K/V already in the caches (any [pages, page, Hkv, D] / [slots, Hkv, D]
        view with contiguous slots); ``window``: a sliding window's keys (0: the whole context)."""
        new = (q, q, 0, q, q, q, q, 0.0, False, False)
        pages = (indptr, indices, last_page_len)
        return self._launch(q, q.stride(0), q.stride(1), k_cache, v_cache, pages, out, splits, new, window)

    def run_qkv(
        self,
        x: QKVInput,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        last_page_len: torch.Tensor,
        splits: Optional[int] = None,
        window: int = 0,
    ) -> torch.Tensor:
        """Decode straight from the fused projection ``x.qkv`` [rows, (H + 2 Hkv) * D]: q/k-norm, RoPE,
        the K/V store (into the slot after each row's context: the page lists include the new token)
        and attention in one launch, instead of four (norm+rope, store, FlashInfer decode, merge);
        ``window`` as in ``run``."""
        H, HK, D = self.num_heads, self.num_kv_heads, self.head_dim
        qkv, has_norm = x.qkv, x.q_norm is not None
        new = (
            qkv[:, H * D :],
            qkv[:, (H + HK) * D :],
            qkv.stride(0),
            x.positions,
            x.cos_sin_cache,
            x.q_norm if has_norm else qkv,
            x.k_norm if has_norm else qkv,
            x.eps,
            True,
            has_norm,
        )
        pages = (indptr, indices, last_page_len)
        return self._launch(qkv, qkv.stride(0), D, k_cache, v_cache, pages, None, splits, new, window)
