"""The skinny GEMM's Triton kernels (the launches, workspace and entry points: ``skinny.py``): the split-K
kernel ``_skinny_kernel``, the stream-K one ``_streamk_kernel`` and the epilogue both share (SiLU·mul, the
residual add and its sums of squares, the RMSNorm scale).
"""

from __future__ import annotations

from .fused import HAVE_TRITON

if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _skinny_out(acc, acc_u, rstd, dt, SILU: tl.constexpr, NORM: tl.constexpr):
        """The output tile from the fp32 sums (NORM: times each row's RMSNorm scale ``rstd``): as is, or
        silu(gate) * up with HF's rounding points."""
        if NORM:
            acc = acc * rstd[None, :]
            acc_u = acc_u * rstd[None, :]
        if SILU:
            g = acc.to(dt).to(tl.float32)
            act = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
            return (act * acc_u.to(dt).to(tl.float32)).to(dt)
        return acc.to(dt)

    @triton.jit
    def _skinny_store(y, r, o_ptrs, om, ss_ptrs, ADD: tl.constexpr):
        """Store the output tile [BLOCK_N, BLOCK_M]. ADD: it is added to the residual tile ``r`` (what
        ``o_ptrs`` held, loaded early; in the activation dtype as HF adds) and the sum's squares per row
        over this slab's columns go to ``ss_ptrs`` for the RMSNorm after it."""
        if ADD:
            h = (y.to(tl.float32) + r.to(tl.float32)).to(y.dtype)
            tl.store(o_ptrs, h, mask=om)
            hf = h.to(tl.float32)
            tl.store(ss_ptrs, tl.sum(hf * hf, axis=0))
        else:
            tl.store(o_ptrs, y, mask=om)

    @triton.jit
    def _skinny_kernel(
        x_ptr,
        w_ptr,
        out_ptr,
        part_ptr,
        ticket_ptr,
        ss_out_ptr,
        ss_in_ptr,
        eps,
        n_ss_in,
        M,
        N_OUT,
        K,
        k_len,
        x_stride,
        out_stride,
        up_off,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        SPLIT: tl.constexpr,
        SILU: tl.constexpr,
        USE_PDL: tl.constexpr,
        ADD: tl.constexpr,
        NORM: tl.constexpr,
        SS_IN: tl.constexpr,
        PACKED: tl.constexpr = False,
    ):
        """out[m, n] = sum_k x[m, k] * w[n, k] over this program's K share [pid_k * k_len, +k_len).

        SILU: w is [gate | up] (up rows start at ``up_off``) and out[m, n] = silu(gate)[m, n] * up[m, n].
        SPLIT: the K shares' fp32 partials go to ``part_ptr``; the last program of a column slab (an
        acq_rel ticket says which) sums them in split order and writes the output.
        ADD: out[m, n] += the product (in place) and ss_out[slab, m] = the slab's sum of out[m, :]².
        NORM: the product is of RMSNorm(x) without its weight (folded into w), each row's scale from
        its squares summed over ``n_ss_in`` slab partials [n_ss_in, BLOCK_M] at ``ss_in`` (SS_IN: their
        count rounded up to a power of two) and applied to the fp32 sums, so the K loop is the plain one.
        PACKED: w is in ``pack``'s order for this launch's tiles (each tile one contiguous block).
        """
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        n_k = tl.num_programs(1)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rm = tl.arange(0, BLOCK_M)
        rk = tl.arange(0, BLOCK_K)
        k_lo = pid_k * k_len
        xm = rm[None, :] < M
        if PACKED:  # tile (slab, K tile) is one contiguous [BLOCK_N, BLOCK_K] block, slab-major
            rl = tl.arange(0, BLOCK_N)
            t0 = (pid_n * (K // BLOCK_K) + k_lo // BLOCK_K).to(tl.int64) * (BLOCK_N * BLOCK_K)
            g_rows = w_ptr + t0 + rl[:, None] * BLOCK_K + rk[None, :]
            u_rows = g_rows + up_off.to(tl.int64) * K
        else:
            g_rows = w_ptr + rn[:, None].to(tl.int64) * K + (k_lo + rk)[None, :]
            u_rows = w_ptr + (rn[:, None] + up_off).to(tl.int64) * K + (k_lo + rk)[None, :]
        x_cols = x_ptr + rm[None, :] * x_stride + (k_lo + rk)[:, None]
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        # first tile: the weight before the PDL wait (nothing writes weights), the activations after
        wg = tl.load(g_rows)
        if SILU:
            wu = tl.load(u_rows)
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        dt = out_ptr.dtype.element_ty
        om = xm & (rn[:, None] < N_OUT)
        o_ptrs = out_ptr + rm[None, :] * out_stride + rn[:, None]
        r = tl.zeros([BLOCK_N, BLOCK_M], dtype=dt)
        if ADD:  # the residual tile, requested now so the epilogue does not wait for it
            r = tl.load(o_ptrs, mask=om, other=0.0)
        if NORM:  # the producer's slab partials: requested now, summed (in slab order) after the K loop
            sp = tl.arange(0, SS_IN)
            ss = tl.load(ss_in_ptr + sp[:, None] * BLOCK_M + rm[None, :], mask=sp[:, None] < n_ss_in, other=0.0)
        xt = tl.load(x_cols, mask=xm, other=0.0)
        acc = tl.dot(wg, xt, acc)
        if SILU:
            acc_u = tl.dot(wu, xt, acc_u)
        for k0 in range(BLOCK_K, k_len, BLOCK_K):
            wk = k0 * BLOCK_N if PACKED else k0  # packed: the next K tile is the next contiguous block
            wg = tl.load(g_rows + wk)
            xt = tl.load(x_cols + k0, mask=xm, other=0.0)
            acc = tl.dot(wg, xt, acc)
            if SILU:
                wu = tl.load(u_rows + wk)
                acc_u = tl.dot(wu, xt, acc_u)
        rstd = tl.zeros([BLOCK_M], dtype=tl.float32)
        if NORM:
            rstd = tl.rsqrt(tl.sum(ss, axis=0) / K + eps)
        ss_ptrs = ss_out_ptr + pid_n * BLOCK_M + rm
        if SPLIT:
            tile = (pid_n * n_k + pid_k) * (BLOCK_N * BLOCK_M)
            cell = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + rm[None, :]
            up_part = n_k * tl.num_programs(0) * (BLOCK_N * BLOCK_M)  # the up partials follow the gate's
            tl.store(part_ptr + tile + cell, acc)
            if SILU:
                tl.store(part_ptr + tile + cell + up_part, acc_u)
            tl.debug_barrier()  # every thread's partials written before the ticket publishes them
            ticket = tl.atomic_add(ticket_ptr + pid_n, 1)
            if ticket == n_k - 1:
                acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
                acc_u = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
                for s in range(0, n_k):  # split order, whoever came last: deterministic
                    t = (pid_n * n_k + s) * (BLOCK_N * BLOCK_M)
                    acc += tl.load(part_ptr + t + cell, cache_modifier=".cg")
                    if SILU:
                        acc_u += tl.load(part_ptr + t + cell + up_part, cache_modifier=".cg")
                _skinny_store(_skinny_out(acc, acc_u, rstd, dt, SILU, NORM), r, o_ptrs, om, ss_ptrs, ADD)
                tl.store(ticket_ptr + pid_n, 0)  # ready for the next launch / replay
        else:
            _skinny_store(_skinny_out(acc, acc_u, rstd, dt, SILU, NORM), r, o_ptrs, om, ss_ptrs, ADD)

    @triton.jit
    def _streamk_flush(
        acc, acc_u, part_ptr, seg, cell, up_part, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, SILU: tl.constexpr
    ):
        """Store a segment's fp32 sums as partial ``seg`` and start the next segment from zero."""
        tl.store(part_ptr + seg * (BLOCK_N * BLOCK_M) + cell, acc)
        if SILU:
            tl.store(part_ptr + up_part + seg * (BLOCK_N * BLOCK_M) + cell, acc_u)
        return tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32), tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32), seg + 1

    @triton.jit
    def _streamk_kernel(
        x_ptr,
        w_ptr,
        out_ptr,
        part_ptr,
        ticket_ptr,
        ss_out_ptr,
        ss_in_ptr,
        eps,
        n_ss_in,
        prog_ptr,
        slab_ptr,
        M,
        N_OUT,
        K,
        T,
        x_stride,
        out_stride,
        up_off,
        up_part,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        SILU: tl.constexpr,
        USE_PDL: tl.constexpr,
        ADD: tl.constexpr,
        NORM: tl.constexpr,
        SS_IN: tl.constexpr,
    ):
        """``_skinny_kernel``'s product and epilogues with the work spread evenly over a fixed number of
        programs (stream-K): the (column slab, K tile) units in slab-major order, program p taking the
        units [u0, u1) of ``prog_ptr`` [p] = (u0, u1, its first segment). A program's units cut at slab
        boundaries give segments, numbered in unit order; each is stored as an fp32 partial, and the
        last program to finish a slab (an acq_rel ticket) sums that slab's segments in order
        (``slab_ptr`` [slab] = (first segment, count)) and runs the epilogue. So every program streams
        the same share of the weight whatever N / BLOCK_N is, and the result does not depend on which
        program finishes first.
        """
        pid = tl.program_id(0)
        u0 = tl.load(prog_ptr + 3 * pid)
        u1 = tl.load(prog_ptr + 3 * pid + 1)
        seg = tl.load(prog_ptr + 3 * pid + 2)
        rb = tl.arange(0, BLOCK_N)
        rm = tl.arange(0, BLOCK_M)
        rk = tl.arange(0, BLOCK_K)
        xm = rm[None, :] < M
        cell = rb[:, None] * BLOCK_M + rm[None, :]
        g_rows = w_ptr + rb[:, None].to(tl.int64) * K + rk[None, :]  # slab 0, K tile 0; a unit adds its offset
        x_cols = x_ptr + rm[None, :] * x_stride + rk[:, None]
        # first unit: the weight before the PDL wait (nothing writes weights), the activations after
        slab = u0 // T
        kt = u0 - slab * T
        w_off = (slab * BLOCK_N).to(tl.int64) * K + kt * BLOCK_K
        wg = tl.load(g_rows + w_off)
        if SILU:
            wu = tl.load(g_rows + up_off.to(tl.int64) * K + w_off)
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        rstd = tl.zeros([BLOCK_M], dtype=tl.float32)
        if NORM:  # the producer's slab partials, summed in slab order
            sp = tl.arange(0, SS_IN)
            ss = tl.load(ss_in_ptr + sp[:, None] * BLOCK_M + rm[None, :], mask=sp[:, None] < n_ss_in, other=0.0)
            rstd = tl.rsqrt(tl.sum(ss, axis=0) / K + eps)
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        xt = tl.load(x_cols + kt * BLOCK_K, mask=xm, other=0.0)
        acc = tl.dot(wg, xt, acc)
        if SILU:
            acc_u = tl.dot(wu, xt, acc_u)
        if (kt == T - 1) | (u0 + 1 == u1):
            acc, acc_u, seg = _streamk_flush(acc, acc_u, part_ptr, seg, cell, up_part, BLOCK_N, BLOCK_M, SILU)
        for u in range(u0 + 1, u1):
            slab = u // T
            kt = u - slab * T
            w_off = (slab * BLOCK_N).to(tl.int64) * K + kt * BLOCK_K
            wg = tl.load(g_rows + w_off)
            xt = tl.load(x_cols + kt * BLOCK_K, mask=xm, other=0.0)
            acc = tl.dot(wg, xt, acc)
            if SILU:
                wu = tl.load(g_rows + up_off.to(tl.int64) * K + w_off)
                acc_u = tl.dot(wu, xt, acc_u)
            if (kt == T - 1) | (u + 1 == u1):
                acc, acc_u, seg = _streamk_flush(acc, acc_u, part_ptr, seg, cell, up_part, BLOCK_N, BLOCK_M, SILU)
        tl.debug_barrier()  # every thread's partials written before a ticket publishes them
        dt = out_ptr.dtype.element_ty
        for s in range(u0 // T, (u1 - 1) // T + 1):
            first = tl.load(slab_ptr + 2 * s)
            count = tl.load(slab_ptr + 2 * s + 1)
            ticket = tl.atomic_add(ticket_ptr + s, 1)
            if ticket == count - 1:
                acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
                acc_u = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
                for j in range(first, first + count):  # unit order, whoever came last: deterministic
                    acc += tl.load(part_ptr + j * (BLOCK_N * BLOCK_M) + cell, cache_modifier=".cg")
                    if SILU:
                        acc_u += tl.load(part_ptr + up_part + j * (BLOCK_N * BLOCK_M) + cell, cache_modifier=".cg")
                rn = s * BLOCK_N + rb
                om = xm & (rn[:, None] < N_OUT)
                o_ptrs = out_ptr + rm[None, :] * out_stride + rn[:, None]
                r = tl.zeros([BLOCK_N, BLOCK_M], dtype=dt)
                if ADD:
                    r = tl.load(o_ptrs, mask=om, other=0.0)
                _skinny_store(
                    _skinny_out(acc, acc_u, rstd, dt, SILU, NORM), r, o_ptrs, om, ss_out_ptr + s * BLOCK_M + rm, ADD
                )
                tl.store(ticket_ptr + s, 0)  # ready for the next launch / replay
