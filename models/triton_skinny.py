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

Used for CUDA bf16/fp16 with Triton where bench/skinny_bench.py measured it faster than cuBLAS; the
shapes and launch configs it won are in ``TUNED``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Optional

import torch

from .triton_kernels import HAVE_TRITON, use_pdl

MIN_M, MAX_M = 2, 64

if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _skinny_x(x_cols, k0, xm, rstd, nw_rows, NORM: tl.constexpr):
        """The activations' tile [BLOCK_K, BLOCK_M] at K offset k0; NORM: RMSNorm'd on load with HF's
        rounding points (normalise, round, scale by the norm weight, round)."""
        xt = tl.load(x_cols + k0, mask=xm, other=0.0)
        if NORM:
            dt = xt.dtype
            y = (xt.to(tl.float32) * rstd[None, :]).to(dt).to(tl.float32)
            xt = (tl.load(nw_rows + k0).to(tl.float32)[:, None] * y).to(dt)
        return xt

    @triton.jit
    def _row_rstd(ss_ptr, n_ss, K, eps, rm, BLOCK_M: tl.constexpr):
        """1 / RMS of each row from the per-slab sums of squares the producing projection left
        ([slab, 64] fp32), summed in slab order: the same rows give the same scale, bit for bit."""
        acc = tl.zeros([BLOCK_M], dtype=tl.float32)
        for s0 in range(0, n_ss, 32):
            sl = s0 + tl.arange(0, 32)
            acc += tl.sum(tl.load(ss_ptr + sl[:, None] * 64 + rm[None, :], mask=sl[:, None] < n_ss, other=0.0),
                          axis=0)
        return tl.rsqrt(acc / K + eps)

    @triton.jit
    def _skinny_out(acc, acc_u, dt, SILU: tl.constexpr):
        """The output tile from the fp32 sums: as is, or silu(gate) * up with HF's rounding points."""
        if SILU:
            g = acc.to(dt).to(tl.float32)
            act = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
            return (act * acc_u.to(dt).to(tl.float32)).to(dt)
        return acc.to(dt)

    @triton.jit
    def _skinny_store(o_ptrs, om, tile, ss_out, rm, ADD: tl.constexpr):
        """Store the output tile [BLOCK_N, BLOCK_M]; ADD: into the residual stream it points at (HF's
        ``residual + out`` in the activation dtype), and leave the slab's per-row sums of squares of
        the new residual for the next RMSNorm."""
        if ADD:
            r = tl.load(o_ptrs, mask=om, other=0.0)
            tile = (r.to(tl.float32) + tile.to(tl.float32)).to(r.dtype)
            sf = tl.where(om, tile.to(tl.float32), 0.0)
            tl.store(ss_out + rm, tl.sum(sf * sf, axis=0))
        tl.store(o_ptrs, tile, mask=om)

    @triton.jit
    def _skinny_kernel(x_ptr, w_ptr, out_ptr, part_ptr, ticket_ptr, M, N_OUT, K, k_len, x_stride, out_stride,
                       up_off, nw_ptr, ss_in_ptr, n_ss, ss_out_ptr, eps,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       SPLIT: tl.constexpr, SILU: tl.constexpr, USE_PDL: tl.constexpr,
                       NORM: tl.constexpr, ADD: tl.constexpr):
        """out[m, n] = sum_k x[m, k] * w[n, k] over this program's K share [pid_k * k_len, +k_len).

        SILU: w is [gate | up] (up rows start at ``up_off``) and out[m, n] = silu(gate)[m, n] * up[m, n].
        SPLIT: the K shares' fp32 partials go to ``part_ptr``; the last program of a column slab (an
        acq_rel ticket says which) sums them in split order and writes the output.
        NORM: x is the residual stream, RMSNorm'd (weight ``nw_ptr``) on load; its rows' sums of
        squares are the ``n_ss`` slab partials at ``ss_in_ptr`` an ADD launch left.
        ADD: out is the residual stream, added to in place; each column slab's per-row sums of squares
        of the result go to ``ss_out_ptr`` (slab-major, 64 rows a slab).
        """
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        n_k = tl.num_programs(1)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rm = tl.arange(0, BLOCK_M)
        rk = tl.arange(0, BLOCK_K)
        k_lo = pid_k * k_len
        xm = rm[None, :] < M
        g_rows = w_ptr + rn[:, None].to(tl.int64) * K + (k_lo + rk)[None, :]
        u_rows = w_ptr + (rn[:, None] + up_off).to(tl.int64) * K + (k_lo + rk)[None, :]
        x_cols = x_ptr + rm[None, :] * x_stride + (k_lo + rk)[:, None]
        nw_rows = nw_ptr + k_lo + rk
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        # first tile: the weight before the PDL wait (nothing writes weights), the activations after
        wg = tl.load(g_rows)
        if SILU:
            wu = tl.load(u_rows)
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        rstd = tl.zeros([BLOCK_M], dtype=tl.float32)
        if NORM:
            rstd = _row_rstd(ss_in_ptr, n_ss, K, eps, rm, BLOCK_M)
        xt = _skinny_x(x_cols, 0, xm, rstd, nw_rows, NORM)
        acc = tl.dot(wg, xt, acc)
        if SILU:
            acc_u = tl.dot(wu, xt, acc_u)
        for k0 in range(BLOCK_K, k_len, BLOCK_K):
            wg = tl.load(g_rows + k0)
            xt = _skinny_x(x_cols, k0, xm, rstd, nw_rows, NORM)
            acc = tl.dot(wg, xt, acc)
            if SILU:
                wu = tl.load(u_rows + k0)
                acc_u = tl.dot(wu, xt, acc_u)
        dt = out_ptr.dtype.element_ty
        om = xm & (rn[:, None] < N_OUT)
        o_ptrs = out_ptr + rm[None, :] * out_stride + rn[:, None]
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
                _skinny_store(o_ptrs, om, _skinny_out(acc, acc_u, dt, SILU), ss_out_ptr + pid_n * 64, rm, ADD)
                tl.store(ticket_ptr + pid_n, 0)  # ready for the next launch / replay
        else:
            _skinny_store(o_ptrs, om, _skinny_out(acc, acc_u, dt, SILU), ss_out_ptr + pid_n * 64, rm, ADD)


# (N, K, row class, silu) -> (BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages): the best of
# bench/skinny_bench.py --sweep on an H200 (row classes 16 and 64: measured at 8 and 64 rows), kept
# where it beat cuBLAS (plus the SiLU·mul kernel for gate|up) at the same rows, or where the whole sweep's
# table made the model's step faster in bench/ab_decode.py (the 8B's gate|up at 8 rows, qkv and o at 64:
# alone they lost, inside the layer's PDL chain they won). Everything absent keeps cuBLAS: the Qwen3-0.6B
# and Llama-3.1-8B projections are what was measured.
TUNED: dict[tuple[int, int, int, bool], tuple[int, int, int, int, int]] = {
    # Qwen3-0.6B: qkv, o, gate|up, down
    (4096, 1024, 16, False): (64, 128, 1, 4, 6), (1024, 2048, 16, False): (32, 256, 4, 4, 6),
    (6144, 1024, 16, True): (32, 128, 1, 4, 4), (1024, 3072, 16, False): (64, 256, 4, 4, 3),
    (4096, 1024, 64, False): (64, 128, 1, 4, 4), (1024, 3072, 64, False): (16, 128, 4, 4, 3),
    # Llama-3.1-8B
    (6144, 4096, 16, False): (64, 128, 1, 4, 4), (4096, 4096, 16, False): (32, 256, 1, 4, 6),
    (28672, 4096, 16, True): (64, 128, 1, 4, 4), (4096, 14336, 16, False): (32, 256, 1, 4, 6),
    (6144, 4096, 64, False): (64, 128, 1, 4, 4), (4096, 4096, 64, False): (64, 128, 1, 4, 6),
    (28672, 4096, 64, True): (128, 64, 1, 4, 4), (4096, 14336, 64, False): (64, 128, 2, 4, 4),
}

Config = tuple[int, int, int, int, int]


def row_class(m: int) -> Optional[int]:
    """The ``TUNED`` row class of an m-row batch, None outside the kernel's range."""
    if m < MIN_M or m > MAX_M:
        return None
    return 16 if m <= 16 else 64


def configs_for(n: int, k: int, silu: bool = False) -> dict[int, Config]:
    """Row class -> launch config for an (N, K) weight, for the classes where the kernel won."""
    return {c: cfg for c in (16, 64) if (cfg := TUNED.get((n, k, c, silu))) is not None}


def config_ok(n: int, k: int, cfg: Config, silu: bool = False) -> bool:
    """Whether a launch config tiles (N, K) exactly: whole column slabs, whole K tiles per split."""
    block_n, block_k, split, _, _ = cfg
    n_out = n // 2 if silu else n
    return n_out % block_n == 0 and k % (split * block_k) == 0 and k // split >= block_k


#: a residual row's sums of squares, per column slab: slabs x this many rows (the kernel's MAX_M)
SQUARE_ROWS = 64
MAX_SLABS = 1024


@dataclass(frozen=True)
class RowSquares:
    """What an ADD launch leaves for the next RMSNorm: per column slab, each residual row's sum of
    squares (fp32, ``[slabs, SQUARE_ROWS]`` at the start of ``buf``). A NORM launch sums them in slab
    order, so the projection after it needs no separate add+RMSNorm kernel."""

    buf: torch.Tensor
    slabs: int


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
        self._squares: dict[tuple[torch.device, threading.Thread], torch.Tensor] = {}
        self._retired: list[torch.Tensor] = []

    def squares(self, device: torch.device) -> torch.Tensor:
        """This thread's buffer of row sums of squares (fixed size: graphs keep its address). One is
        enough: a layer's projections run in order, each NORM launch reading what the ADD launch
        before it wrote."""
        key = (device, threading.current_thread())
        buf = self._squares.get(key)
        if buf is None:
            buf = self._squares[key] = torch.zeros(MAX_SLABS * SQUARE_ROWS, dtype=torch.float32, device=device)
        return buf

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


def skinny(x: torch.Tensor, weight: torch.Tensor, *, config: Config, silu_mul: bool = False,
           pdl: Optional[bool] = None, norm: Optional[tuple[torch.Tensor, float, RowSquares]] = None,
           out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``linear(x, weight)`` for x [M <= MAX_M, K] (rows may be strided); with ``silu_mul`` the weight
    is [gate | up] (2I rows) and the result silu(x @ gate.T) * (x @ up.T) [M, I].

    ``config`` (BLOCK_N, BLOCK_K, SPLIT_K, warps, stages; ``configs_for`` gives the measured ones) must
    satisfy ``config_ok``. ``norm`` (weight, eps, squares): x is the residual stream and the product
    is ``linear(RMSNorm(x), weight)``, with the row sums of squares ``skinny_add`` left.
    """
    return _launch(x, weight, config, silu_mul, pdl, norm, out, add=False)


def skinny_add(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, *, config: Config,
               pdl: Optional[bool] = None) -> RowSquares:
    """``residual += linear(x, weight)`` in place (HF's rounding: the product rounded, then the add),
    returning the new residual rows' sums of squares for a ``skinny(..., norm=...)`` after it."""
    return _launch(x, weight, config, False, pdl, None, residual, add=True)


def _launch(x: torch.Tensor, weight: torch.Tensor, config: Config, silu_mul: bool, pdl: Optional[bool],
            norm: Optional[tuple[torch.Tensor, float, RowSquares]], out: Optional[torch.Tensor], add: bool):
    m, k = x.shape
    n, kw = weight.shape
    assert kw == k and m <= MAX_M and x.stride(-1) == 1 and weight.is_contiguous()
    block_m = max(16, triton.next_power_of_2(m))
    assert config_ok(n, k, config, silu_mul), (n, k, config, silu_mul)
    assert not (add and silu_mul)
    block_n, block_k, split, warps, stages = config
    n_out = n // 2 if silu_mul else n
    if out is None:
        out = torch.empty((m, n_out), dtype=weight.dtype, device=weight.device)
    assert out.shape == (m, n_out) and out.stride(-1) == 1 and out.dtype == weight.dtype
    if pdl is None:
        pdl = use_pdl(weight.device)
    slabs = n_out // block_n
    parts, tickets = WORKSPACE.get(weight.device, slabs * split * block_n * block_m * (2 if silu_mul else 1),
                                   slabs) if split > 1 else (out, out)
    squares = WORKSPACE.squares(weight.device) if add or norm is not None else out
    assert slabs <= MAX_SLABS
    nw, eps, n_ss = weight, 0.0, 0
    if norm is not None:
        nw, eps, given = norm
        assert given.buf is squares and nw.shape == (k,), "norm squares come from this thread's skinny_add"
        n_ss = given.slabs
    _skinny_kernel[(slabs, split)](
        x, weight, out, parts, tickets, m, n_out, k, k // split, x.stride(0), out.stride(0), n_out,
        nw, squares, n_ss, squares, eps,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT=split > 1, SILU=silu_mul, USE_PDL=pdl,
        NORM=norm is not None, ADD=add, num_warps=warps, num_stages=stages, launch_pdl=pdl)
    return RowSquares(squares, slabs) if add else out
