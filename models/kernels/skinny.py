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
SM, each taking an equal share of the (column slab, K tile) units; ``skinny_kernels._streamk_kernel``): a projection
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

from .fused import HAVE_TRITON, next_pow2, sm_count, use_pdl
from .skinny_tuning import MAX_M, Config, config_ok, reads_packed
from .stream_k import stream_k_plan, stream_k_programs

if HAVE_TRITON:
    from .launch import fast
    from .skinny_kernels import _skinny_kernel, _streamk_kernel


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


_SHAPES: dict[tuple, tuple[int, int, int, dict]] = {}
"""(rows, N, K, config, silu_mul, pdl, add, norm, norm partial slabs, packed) -> (BLOCK_M, column slabs, output
columns, constexprs and launch options): worked out once per launch shape, not per launch (an eager step at
2-64 rows launches ~110 of these)."""


def _launch_shape(
    m: int,
    n: int,
    k: int,
    config: Config,
    silu_mul: bool,
    pdl: bool,
    add: bool,
    norm: bool,
    n_ss_in: int,
    packed: bool,
) -> tuple[int, int, int, dict]:
    assert m <= MAX_M, f"the skinny GEMM handles at most {MAX_M} rows, got {m}"
    assert config_ok(n, k, config, silu_mul), (n, k, config, silu_mul)
    assert not packed or reads_packed(config), ("a packed weight for a launch that cannot read it", config)
    block_n, block_k, _, warps, stages = config
    block_m = max(16, next_pow2(m))
    n_out = n // 2 if silu_mul else n
    flags = dict(
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        SILU=silu_mul,
        USE_PDL=pdl,
        ADD=add,
        NORM=norm,
        SS_IN=next_pow2(max(n_ss_in, 1)),
        num_warps=warps,
        num_stages=stages,
        launch_pdl=pdl,
    )
    return block_m, n_out // block_n, n_out, flags


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
    n = weight.shape[0]
    assert weight.shape[1] == k and x.stride(-1) == 1 and weight.is_contiguous()
    if pdl is None:
        pdl = use_pdl(weight.device)
    n_ss_in = 0 if norm is None else norm.partials.shape[0]
    at = (m, n, k, config, silu_mul, pdl, add, norm is not None, n_ss_in, packed)
    shape = _SHAPES.get(at)
    if shape is None:
        shape = _SHAPES[at] = _launch_shape(*at)
    block_m, slabs, n_out, flags = shape
    block_n, block_k, split = config[:3]
    if norm is not None:
        assert norm.partials.shape[1] == block_m  # the producer's rows: the same M
    ss_out = torch.empty((slabs, block_m), dtype=torch.float32, device=weight.device) if add else None
    # the pointer and scalar arguments both kernels take first, then the epilogue switches
    common = (x, weight, out)
    epilogue = (
        out if ss_out is None else ss_out,
        out if norm is None else norm.partials,
        0.0 if norm is None else norm.eps,
        n_ss_in,
    )
    if split <= 0:  # stream-K: a fixed number of programs, each an equal share of the units
        tiles = k // block_k
        plan = stream_k_plan(
            weight.device, slabs, tiles, stream_k_programs(split, sm_count(weight.device), slabs * tiles)
        )
        up_part = plan.segments * block_n * block_m
        parts, tickets = WORKSPACE.get(weight.device, up_part * (2 if silu_mul else 1), slabs)
        fast(_streamk_kernel)[(plan.programs.shape[0],)](
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
    fast(_skinny_kernel)[(slabs, split)](
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
