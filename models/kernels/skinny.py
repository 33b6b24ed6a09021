"""Skinny GEMM (Triton, tensor cores) for decode batches of a few to 64 rows: ``x @ w.T`` with the
weight as the tall operand, K split across programs where N alone gives too few, and SiLU·mul
optionally fused into the gate|up projection's epilogue.

Why: between one row (the fused GEMV) and prefill-sized batches a projection still reads its whole
weight once and does little arithmetic, so its time is how well the weight streams. cuBLAS picks
tiles made for square problems there: few programs for the small-N projections (o, down) and a
ramp-up that is most of a short kernel. Here the weight tile is the MMA's tall side (``w_tile @ x.T``:
the handful of rows is the narrow side, padded to 16), K may be split so every SM streams, and a
split's partial sums are merged by whichever program of a column slab finishes last, in split order,
so the result is deterministic (graph replay must equal eager bit for bit). With programmatic
dependent launch the first weight tile is requested before waiting for the previous kernel (no kernel
writes weights). SiLU·mul in the gate|up epilogue saves a launch and a round trip per layer and keeps
HF's rounding points (gate and up rounded to the activation dtype, SiLU rounded, then the product).

The layer's add+RMSNorms can ride in the projections around them: the o and down projections add into
the residual stream in their epilogue (``skinny_add``, HF's rounding of the add) and leave each column
slab's sum of squares per row; the q|k|v and gate|up projections after them (``norm=``) run the plain K
loop over the residual and multiply their fp32 sums by each row's 1/RMS, the slab partials summed in
slab order (deterministic). The norm's weight must then be folded into theirs
(``DecoderLayer.fold_norm_weights``): normalising the activation tiles inside the K loop, HF's rounding
exactly, stalled the products on the tiles' trip through registers. A layer then runs four dependent
launches around its attention instead of six: at a few rows each launch in the chain is microseconds of
latency, the norm's bytes are nothing.

A config may instead spread the work stream-K (split <= 0: a fixed number of programs, one or two an
SM, each taking an equal share of the (column slab, K tile) units; ``_streamk_kernel``): a projection
whose N / BLOCK_N leaves SMs idle (the 8B's q|k|v: 96 slabs on 132 SMs) then streams on all of them.
No shipped config uses it: in the model every one tried was slower than the split-K launch it replaced
(bench/ab_decode.py, docs/benchmarks.md), so it remains a candidate for the sweeps (bench/skinny_bench.py,
bench/ab_decode.py).

Used for CUDA bf16/fp16 with Triton where bench/skinny_bench.py measured it faster than cuBLAS; the
shapes and launch configs it won are in ``skinny_tuning.TUNED``. It runs up to 256 rows, so that the sweeps can measure
the row classes above 64 too; there cuBLAS's GEMMs, tiled on both sides, won every projection of both
benchmark shapes, so no config of those classes is shipped.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Optional

import torch

from .fused import HAVE_TRITON, sm_count, use_pdl
from .skinny_tuning import MAX_M, Config, config_ok, reads_packed
from .stream_k import stream_k_plan, stream_k_programs

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


class SkinnyWorkspace:
    """Split partials and tickets, one set per (device, thread), grown on demand outside graphs.

    Per thread because the split merge hands partials between programs through them: two launches
    running at once must not share a set, and the engine's parity check re-runs the model eagerly on
    its own thread and stream while the serving thread replays graphs. One thread's launches are
    ordered on its stream (captures happen on it between steps, after an eager warmup that grows the
    set outside the capture). A graph keeps the buffers it was captured with: sets are never freed,
    only retired when they grow, and keyed by the thread object (never reused, unlike thread ids).
    """

    def __init__(self) -> None:
        self._sets: dict[tuple[torch.device, threading.Thread], tuple[torch.Tensor, torch.Tensor]] = {}
        self._retired: list[torch.Tensor] = []

    def get(self, device: torch.device, parts: int, tickets: int) -> tuple[torch.Tensor, torch.Tensor]:
        key = (device, threading.current_thread())
        p, t = self._sets.get(key, (None, None))
        if p is None or p.numel() < parts:
            if p is not None:
                self._retired.append(p)
            p = torch.empty(max(parts, 1 << 16), dtype=torch.float32, device=device)
        if t is None or t.numel() < tickets:
            if t is not None:
                self._retired.append(t)
            t = torch.zeros(max(tickets, 1024), dtype=torch.int32, device=device)
        self._sets[key] = (p, t)
        return p, t


WORKSPACE = SkinnyWorkspace()


@dataclass(frozen=True)
class NormInput:
    """RMSNorm of a projection's input, its weight folded into the projection's (``DecoderLayer.fold_norm_weights``):
    the input rows' sums of squares as slab partials (what ``skinny_add`` returned for that input) and
    the norm's epsilon."""

    partials: torch.Tensor
    eps: float


def skinny(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    config: Config,
    silu_mul: bool = False,
    pdl: Optional[bool] = None,
    norm: Optional[NormInput] = None,
    out: Optional[torch.Tensor] = None,
    packed: bool = False,
) -> torch.Tensor:
    """``linear(x, weight)`` for x [M <= MAX_M, K] (rows may be strided); with ``silu_mul`` the weight
    is [gate | up] (2I rows) and the result silu(x @ gate.T) * (x @ up.T) [M, I]; with ``norm`` the
    input is RMSNorm(x). Into ``out`` (contiguous rows) when given.

    ``config`` (BLOCK_N, BLOCK_K, SPLIT_K, warps, stages; ``skinny_tuning.configs_for`` gives the measured
    ones) must satisfy ``skinny_tuning.config_ok``.
    """
    n = weight.shape[0] // 2 if silu_mul else weight.shape[0]
    if out is None:
        out = torch.empty((x.shape[0], n), dtype=weight.dtype, device=weight.device)
    assert out.shape == (x.shape[0], n) and out.stride(-1) == 1, (tuple(out.shape), n)
    _launch(x, weight, out, config, silu_mul, pdl, norm, add=False, packed=packed)
    return out


def skinny_add(
    x: torch.Tensor,
    weight: torch.Tensor,
    residual: torch.Tensor,
    *,
    config: Config,
    pdl: Optional[bool] = None,
    packed: bool = False,
) -> torch.Tensor:
    """``residual += linear(x, weight)`` in place (the add rounded to the activation dtype, as HF adds),
    returning the sums of squares of the new residual rows as column-slab partials, the
    ``NormInput.partials`` of the projection that normalises it next."""
    assert residual.is_contiguous() and residual.shape == (x.shape[0], weight.shape[0])
    partials = _launch(x, weight, residual, config, False, pdl, None, add=True, packed=packed)
    assert partials is not None
    return partials


def pack(weight: torch.Tensor, config: Config, silu_mul: bool = False) -> torch.Tensor:
    """The weight [N, K] rearranged for a launch of ``config`` with ``packed=True``: each (column slab,
    K tile) [BLOCK_N, BLOCK_K] one contiguous block, a slab's K tiles in order (with ``silu_mul`` the
    gate and up halves each so), so a program streams consecutive bytes. Same shape, other order."""
    block_n, block_k = config[:2]
    n, k = weight.shape
    halves = weight.chunk(2) if silu_mul else (weight,)
    blocks = [
        h.reshape(h.shape[0] // block_n, block_n, k // block_k, block_k).permute(0, 2, 1, 3).reshape(-1) for h in halves
    ]
    return torch.cat(blocks).view(n, k)


def _launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor,
    config: Config,
    silu_mul: bool,
    pdl: Optional[bool],
    norm: Optional[NormInput],
    *,
    add: bool,
    packed: bool = False,
) -> Optional[torch.Tensor]:
    """One launch into ``out``; with ``add`` the product is added into it and the slab partials of its
    rows' squares [slabs, BLOCK_M] are returned; ``packed``: the weight is in ``pack``'s order for ``config``."""
    m, k = x.shape
    n, kw = weight.shape
    assert kw == k and m <= MAX_M and x.stride(-1) == 1 and weight.is_contiguous()
    block_m = max(16, triton.next_power_of_2(m))
    assert config_ok(n, k, config, silu_mul), (n, k, config, silu_mul)
    assert not packed or reads_packed(config), ("a packed weight for a launch that cannot read it", config)
    block_n, block_k, split, warps, stages = config
    n_out = n // 2 if silu_mul else n
    if pdl is None:
        pdl = use_pdl(weight.device)
    slabs = n_out // block_n
    ss_out = torch.empty((slabs, block_m), dtype=torch.float32, device=weight.device) if add else None
    n_ss_in = 0
    if norm is not None:
        n_ss_in = norm.partials.shape[0]
        assert norm.partials.shape[1] == block_m  # the producer's rows: the same M
    # the pointer and scalar arguments both kernels take first, then the epilogue switches
    common = (x, weight, out)
    epilogue = (
        out if ss_out is None else ss_out,
        out if norm is None else norm.partials,
        0.0 if norm is None else norm.eps,
        n_ss_in,
    )
    flags = dict(
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        SILU=silu_mul,
        USE_PDL=pdl,
        ADD=add,
        NORM=norm is not None,
        SS_IN=triton.next_power_of_2(max(n_ss_in, 1)),
        num_warps=warps,
        num_stages=stages,
        launch_pdl=pdl,
    )
    if split <= 0:  # stream-K: a fixed number of programs, each an equal share of the units
        tiles = k // block_k
        plan = stream_k_plan(
            weight.device, slabs, tiles, stream_k_programs(split, sm_count(weight.device), slabs * tiles)
        )
        up_part = plan.segments * block_n * block_m
        parts, tickets = WORKSPACE.get(weight.device, up_part * (2 if silu_mul else 1), slabs)
        _streamk_kernel[(plan.programs.shape[0],)](
            *common,
            parts,
            tickets,
            *epilogue,
            plan.programs,
            plan.slabs,
            m,
            n_out,
            k,
            tiles,
            x.stride(0),
            out.stride(0),
            n_out,
            up_part,
            **flags,
        )
        return ss_out
    parts, tickets = (
        WORKSPACE.get(weight.device, slabs * split * block_n * block_m * (2 if silu_mul else 1), slabs)
        if split > 1
        else (out, out)
    )
    _skinny_kernel[(slabs, split)](
        *common,
        parts,
        tickets,
        *epilogue,
        m,
        n_out,
        k,
        k // split,
        x.stride(0),
        out.stride(0),
        n_out,
        SPLIT=split > 1,
        PACKED=packed,
        **flags,
    )
    return ss_out
