"""A decoder layer's whole MLP in one Triton launch at decode batch 1-4: RMSNorm, gate|up, SiLU·mul, down, residual add.

Why: at a few rows the MLP on the fused GEMV (models/kernels/gemv.py) is two launches, gate|up with the
RMSNorm in its prologue, then down with SiLU·mul in its prologue and the residual add in its epilogue.
For a small model (Qwen3-0.6B) a step is bound by launches more than by bytes, and the second launch's
gap and memory-pipeline ramp are paid 28 times a step. Here each program owns a slice of the
intermediate dimension: it computes its gate and up rows, SiLU·mul, and multiplies that slice by the
matching columns of the down weight, so no program needs another's activations. What crosses programs
is the down projection's sum over the intermediate dimension: each program writes an fp32 partial
[rows, hidden] into a workspace, and tickets let the last program of each group add its group's
partials, and the last of those add the group sums and the residual, in a fixed order whatever order
the programs finished in. No float atomics: the result is deterministic, as a graph replay needs.

Rounding follows the two-launch path point for point: the gate/up sums scaled by RMSNorm's 1/rms and
rounded to the activation dtype, silu(gate) rounded, times up, rounded, the down sum rounded before the
residual add (in the activation dtype). The only difference is the order of the down projection's fp32
sums, so the outputs agree to about one bf16 ulp.

Used by ``KernelConfig.fused_mlp`` "on" (and "auto" for the shapes ``MEASURED_WINS`` lists) for the fused-GEMV
layers (CUDA bf16/fp16, Triton, <= ``MAX_ROWS`` rows, bias-free MLPs not sharded by rows). The block sizes are
unmeasured defaults (``pick_config``).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from .fused import HAVE_TRITON, cdiv, next_pow2
from .gemv import MAX_M

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from .gemv import _gemv_step, _gemv_weights
    from .launch import fast

    @triton.jit
    def _sum_partials(src, first, count, c, c_mask, stride, BLOCK_C: tl.constexpr, RED: tl.constexpr):
        """fp32 sum of rows ``first .. first + count - 1`` of the partials at ``src`` (``stride`` apart),
        columns ``c``: RED rows a load, always added in the same order."""
        acc = tl.zeros([BLOCK_C], dtype=tl.float32)
        for p0 in range(0, count, RED):
            rp = p0 + tl.arange(0, RED)
            mask = (rp < count)[:, None] & c_mask[None, :]
            at = src + (first + rp)[:, None] * stride + c[None, :]
            tile = tl.load(at, mask=mask, other=0.0, cache_modifier=".cg")
            acc += tl.sum(tile, axis=0)
        return acc

    @triton.jit
    def _fused_mlp_kernel(
        h_ptr,
        wgu_ptr,
        nw_ptr,
        wd_ptr,
        part_ptr,
        ticket_ptr,
        M,
        H,
        INTER,
        h_stride,
        group_size,
        eps,
        BLOCK_M: tl.constexpr,
        BLOCK_I: tl.constexpr,
        BLOCK_K: tl.constexpr,
        BLOCK_H: tl.constexpr,
        BLOCK_C: tl.constexpr,
        RED: tl.constexpr,
        EVEN_K: tl.constexpr,
        EVEN_I: tl.constexpr,
        USE_PDL: tl.constexpr,
        TRIGGER: tl.constexpr,
    ):
        """h[m] += down(silu(gate(RMSNorm(h[m]))) * up(RMSNorm(h[m]))) for the M rows of h (in place).

        wgu [2 * INTER, H] is [gate | up] (the norm weight ``nw`` also applies, as in the GEMV: ones
        where it is folded into wgu), wd [H, INTER]. Program p owns intermediate columns
        [p * BLOCK_I, (p + 1) * BLOCK_I): its gate and up rows are loaded interleaved as one tile of
        2 * BLOCK_I rows (row 2j gate j, row 2j + 1 up j), summed over H with the RMSNorm prologue of
        the GEMV (one pass, the 1/rms applied after), so SiLU·mul pairs them without moving data.

        Partials: part[p] is [M, H] fp32 (M * H apart); the group sums follow the P partials. Tickets
        [groups + 1] int32: ticket[g] counts group g's finished programs, ticket[groups] the finished
        groups. Every program reads h before it takes its ticket, and only the last writes h.

        USE_PDL: the first gate|up tile is requested before waiting for the previous kernel (whose
        output h is read after the wait); TRIGGER without it: still let a PDL-launched kernel after
        this one start its programs while this one's last run.
        """
        pid = tl.program_id(0)
        programs = tl.num_programs(0)
        K = H
        dt = wgu_ptr.dtype.element_ty
        rm = tl.arange(0, BLOCK_M)
        m_mask = rm < M
        # gate|up rows, interleaved: r = 2j + t -> row t * INTER + i0 + j
        r = tl.arange(0, 2 * BLOCK_I)
        ri = pid * BLOCK_I + r // 2
        i_mask = ri < INTER
        w_rows = wgu_ptr + ((r % 2) * INTER + ri)[:, None].to(tl.int64) * K
        x_rows = h_ptr + rm[:, None] * h_stride
        if BLOCK_M == 1:
            acc = tl.zeros([2 * BLOCK_I, BLOCK_K], dtype=tl.float32)
        else:
            acc = tl.zeros([BLOCK_M, 2 * BLOCK_I, BLOCK_K], dtype=tl.float32)
        ss = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
        rk = tl.arange(0, BLOCK_K)
        wv = _gemv_weights(w_rows, rk, K, i_mask, EVEN_K, EVEN_I)
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
        if USE_PDL or TRIGGER:
            tl.extra.cuda.gdc_launch_dependents()
        acc, ss = _gemv_step(acc, ss, wv, x_rows, nw_ptr, rk, K, m_mask, dt, 1, BLOCK_M, EVEN_K)
        for k0 in range(BLOCK_K, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            wv = _gemv_weights(w_rows, rk, K, i_mask, EVEN_K, EVEN_I)
            acc, ss = _gemv_step(acc, ss, wv, x_rows, nw_ptr, rk, K, m_mask, dt, 1, BLOCK_M, EVEN_K)
        if BLOCK_M == 1:
            gu = tl.sum(acc, axis=1)[None, :]
        else:
            gu = tl.sum(acc, axis=2)
        gu = (gu * tl.rsqrt(tl.sum(ss, axis=1) / K + eps)[:, None]).to(dt).to(tl.float32)
        g, u = tl.split(tl.reshape(gu, [BLOCK_M, BLOCK_I, 2]))
        act = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
        a = (act * u).to(dt).to(tl.float32)  # [BLOCK_M, BLOCK_I]; 0 past INTER (zero weights)

        # this slice's share of the down projection: part[pid][m, n] = sum_j wd[n, i0 + j] * a[m, j]
        rj = pid * BLOCK_I + tl.arange(0, BLOCK_I)
        j_mask = rj < INTER
        rows = M * H
        part = part_ptr + pid * rows
        for n0 in range(0, H, BLOCK_H):
            rn = n0 + tl.arange(0, BLOCK_H)
            n_mask = rn < H
            wd_at = wd_ptr + rn[:, None].to(tl.int64) * INTER + rj[None, :]
            wd = tl.load(wd_at, mask=n_mask[:, None] & j_mask[None, :])
            if BLOCK_M == 1:
                p = tl.sum(wd.to(tl.float32) * a, axis=1)[None, :]
            else:
                p = tl.sum(a[:, None, :] * wd.to(tl.float32)[None, :, :], axis=2)
            tl.store(part + rm[:, None] * H + rn[None, :], p, mask=m_mask[:, None] & n_mask[None, :])

        # every thread's partial is written before the ticket; the last of a group sums the group's
        groups = tl.cdiv(programs, group_size)
        grp = pid // group_size
        first = grp * group_size
        count = tl.minimum(group_size, programs - first)
        sums = part_ptr + programs * rows
        tl.debug_barrier()
        if tl.atomic_add(ticket_ptr + grp, 1) == count - 1:
            for c0 in range(0, rows, BLOCK_C):
                c = c0 + tl.arange(0, BLOCK_C)
                c_mask = c < rows
                s = _sum_partials(part_ptr, first, count, c, c_mask, rows, BLOCK_C, RED)
                tl.store(sums + grp * rows + c, s, mask=c_mask)
            tl.store(ticket_ptr + grp, 0)  # ready for the next launch
            tl.debug_barrier()
            if tl.atomic_add(ticket_ptr + groups, 1) == groups - 1:
                for c0 in range(0, rows, BLOCK_C):
                    c = c0 + tl.arange(0, BLOCK_C)
                    c_mask = c < rows
                    y = _sum_partials(sums, 0, groups, c, c_mask, rows, BLOCK_C, RED).to(dt)
                    at = h_ptr + (c // H) * h_stride + c % H
                    res = tl.load(at, mask=c_mask, other=0.0)
                    tl.store(at, (res.to(tl.float32) + y.to(tl.float32)).to(dt), mask=c_mask)
                tl.store(ticket_ptr + groups, 0)


class FusedMLPConfig(NamedTuple):
    """Launch shape: intermediate columns a program owns, its gate|up K tile, its down tile's hidden
    rows, warps, pipeline stages, and programs a reduction group (the last of each sums the group's
    partials; the last group's then sums the groups')."""

    block_i: int
    block_k: int
    block_h: int
    warps: int
    stages: int
    group: int


# (hidden, intermediate) -> config. Not measured on a GPU yet: chosen so that every program's gate|up
# accumulator holds as many fp32 values a thread as the fused GEMV's measured 8 x 1024 tile with four
# warps (64), the grid covers the SMs of an H100/H200 (132) at least once, and the serial reduction tail
# (group + groups partials of [rows, hidden] fp32, read by one program each) stays near 2 * sqrt(programs).
# Qwen3-0.6B: 192 programs, 16 groups of 12 (up to 28 partials of 4 KiB a row in the tail); Llama-3.1-8B:
# 448 programs, 28 groups of 16 (up to 44 partials of 16 KiB a row), eight warps for its 64-row tiles.
DEFAULTS: dict[tuple[int, int], FusedMLPConfig] = {
    (1024, 3072): FusedMLPConfig(16, 256, 512, 4, 2, 12),
    (4096, 14336): FusedMLPConfig(32, 256, 256, 8, 2, 16),
}

MAX_ROWS = 3
"""Rows the one-launch MLP takes; a layer at more of the fused GEMV's rows runs the two GEMVs. At 4 rows on an
H100 its output was 2 ulps from the two GEMVs' on one element (the 0.6B's shape: 1 of 4,096; the 8B's: 2
of 16,384), both as far from an fp32 reference (max |error| 0.0155 and 0.0167 in either path), so the
kernel is not wrong there, but it no longer rounds as the path it replaces; at 1-3 rows it stays within an
ulp (tests/cuda/test_cuda_kernels.py)."""

MEASURED_WINS: frozenset[tuple[int, int]] = frozenset()
"""(hidden, intermediate) shapes whose decode step measured faster with the one-launch MLP than with the two
GEMVs on an H200 (bench/ab_decode.py mlp=fused): ``KernelConfig.fused_mlp`` "auto" takes it for these
only. None yet: it has not been measured on a GPU."""


def measured_win(hidden: int, intermediate: int) -> bool:
    """Whether "auto" runs an MLP of this shape in one launch (``MEASURED_WINS``)."""
    return (hidden, intermediate) in MEASURED_WINS


ACC_PER_WARP = 2048
"""fp32 accumulator values a warp holds in a tile (64 a thread): the block sizes shrink to keep to it."""


def pick_config(hidden: int, intermediate: int) -> FusedMLPConfig:
    """``DEFAULTS`` for a known shape; else 16 intermediate columns a program, a K tile of 256 (64 at small
    hidden sizes), groups of about the square root of the programs. Unmeasured, like ``DEFAULTS``."""
    cfg = DEFAULTS.get((hidden, intermediate))
    if cfg is not None:
        return cfg
    programs = -(-intermediate // 16)
    return FusedMLPConfig(16, 256 if hidden >= 256 else 64, 512, 4, 2, max(1, round(programs**0.5)))


class Workspace(NamedTuple):
    partials: torch.Tensor  # fp32: MAX_M * hidden per program, then the same per group
    tickets: torch.Tensor  # int32: one per group, then one for the groups


_workspaces: dict[tuple[torch.device, int, int, int], Workspace] = {}


def launch_programs(hidden: int, intermediate: int, config: Optional[FusedMLPConfig] = None) -> int:
    """How many programs a ``fused_mlp`` launch runs: one per ``block_i`` intermediate columns."""
    return cdiv(intermediate, (config or pick_config(hidden, intermediate)).block_i)


def workspace(device: torch.device, hidden: int, programs: int, groups: int) -> Workspace:
    """One per device and launch shape, shared by every layer of that shape (a launch is done before the
    next one of them reads it). Allocated once, outside any graph (the first launch is an eager warmup):
    the tickets must start at zero and stay where captured graphs point."""
    key = (device, hidden, programs, groups)
    ws = _workspaces.get(key)
    if ws is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("fused MLP workspace first needed inside a graph capture: warm up eagerly first")
        ws = _workspaces[key] = Workspace(
            torch.empty((programs + groups) * MAX_M * hidden, dtype=torch.float32, device=device),
            torch.zeros(groups + 1, dtype=torch.int32, device=device),
        )
    return ws


def fused_mlp(
    h: torch.Tensor,
    gate_up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    *,
    pdl: bool = False,
    trigger: bool = False,
    config: Optional[FusedMLPConfig] = None,
) -> torch.Tensor:
    """``h += down(silu(gate(RMSNorm(h))) * up(RMSNorm(h)))`` in place, for h [M <= MAX_M, hidden] (rows
    may be strided), in one launch; returns h.

    ``gate_up_weight`` [2 * intermediate, hidden] is [gate | up] (bias-free), ``down_weight``
    [hidden, intermediate]; ``norm_weight`` is RMSNorm's (ones where folded into gate|up). ``pdl``:
    launch with programmatic dependent launch; ``trigger``: without it, still let a PDL-launched kernel
    after this one start early. ``config``: ``pick_config``'s by default.
    """
    m, hidden = h.shape
    two_i, k = gate_up_weight.shape
    inter = two_i // 2
    assert m <= MAX_ROWS, f"fused_mlp handles at most {MAX_ROWS} rows, got {m}"
    assert k == hidden and two_i == 2 * inter and tuple(down_weight.shape) == (hidden, inter), (
        h.shape,
        gate_up_weight.shape,
        down_weight.shape,
    )
    assert h.stride(-1) == 1 and gate_up_weight.is_contiguous() and down_weight.is_contiguous()
    config = config or pick_config(hidden, inter)
    block_i, block_k, block_h, warps, stages, group = config
    block_m = next_pow2(m)
    budget = ACC_PER_WARP * warps
    # the [M, 2 * BLOCK_I, BLOCK_K] and [M, BLOCK_H, BLOCK_I] products must stay in registers
    block_k = max(16, min(block_k, budget // (block_m * 2 * block_i), next_pow2(hidden)))
    block_h = max(16, min(block_h, budget // (block_m * block_i), next_pow2(hidden)))
    red = 8
    block_c = max(16, min(budget // red, next_pow2(m * hidden)))
    programs = launch_programs(hidden, inter, config)
    group = max(1, min(group, programs))
    groups = cdiv(programs, group)
    ws = workspace(h.device, hidden, programs, groups)
    fast(_fused_mlp_kernel)[(programs,)](
        h,
        gate_up_weight,
        norm_weight,
        down_weight,
        ws.partials,
        ws.tickets,
        m,
        hidden,
        inter,
        h.stride(0),
        group,
        eps,
        BLOCK_M=block_m,
        BLOCK_I=block_i,
        BLOCK_K=block_k,
        BLOCK_H=block_h,
        BLOCK_C=block_c,
        RED=red,
        EVEN_K=hidden % block_k == 0,
        EVEN_I=inter % block_i == 0,
        USE_PDL=pdl,
        TRIGGER=trigger and not pdl,
        num_warps=warps,
        num_stages=stages,
        launch_pdl=pdl,
    )
    return h
