"""Small-batch GEMV (Triton) with the decoder's neighbours fused in: RMSNorm before, SiLU·mul before,
residual add after.

Why: at decode batch 1-4 every projection is a matrix-vector product that reads its weight once and
is bound by memory bandwidth, while the ops around it (RMSNorm, residual add, SiLU·mul) are separate
launches that each cost a few microseconds of latency inside the graph. Folding them into the GEMV's
prologue/epilogue takes a layer from 10 kernels to 7 without extra bytes (the activation vector is a
few KiB, L2-resident, re-read by every program). Rounding: SiLU is rounded before the multiply and
the projection output before the residual add, as in HF; RMSNorm's 1/rms is applied after the dot
product (one pass over K instead of two), so the normalised activations are never rounded to bf16 —
a difference of the order of one bf16 ulp in the output, like any change of summation order.

Used only for CUDA bf16/fp16 with Triton and M <= ``MAX_M`` rows; everything else keeps cuBLAS.
"""

from __future__ import annotations

from typing import Optional

import torch

from .fused import HAVE_TRITON, cdiv, next_pow2, use_pdl

TRIGGER_NEXT = True
"""Whether a fused GEMV launched without PDL (the long gate|up, ``use_pdl``'s "auto") lets the PDL-launched
GEMV after it (down) start its programs while its own last ones run (read by ``LayerKernels.set_pdl`` in
models/layers/linear.py; bench/ab_decode.py gemv_trigger=off measures it without)."""

LM_HEAD_GEMV = True
"""Whether a decode step on the fused-GEMV layers also takes its final RMSNorm and lm_head in one GEMV
(``DecoderForCausalLM.decode_logits``; bench/ab_decode.py lm_head=cublas measures the RMSNorm kernel and
cuBLAS instead)."""

MAX_M = 4
"""Rows the kernel handles. The engine uses it for 1 row by default (EngineConfig.fused_gemv_max_rows):
measured on an H200 at 4 rows it lost to cuBLAS + separate kernels on 7 of 8 projections."""

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from .launch import fast

    @triton.jit
    def _gemv_weights(w_rows, rk, K, n_mask, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr):
        if EVEN_K:
            if EVEN_N:
                return tl.load(w_rows + rk[None, :])
            return tl.load(w_rows + rk[None, :], mask=n_mask[:, None], other=0.0)
        return tl.load(w_rows + rk[None, :], mask=n_mask[:, None] & (rk < K)[None, :], other=0.0)

    @triton.jit
    def _gemv_step(
        acc,
        ss,
        wv,
        x_rows,
        nw_ptr,
        rk,
        K,
        m_mask,
        dt,
        PROLOGUE: tl.constexpr,
        BLOCK_M: tl.constexpr,
        EVEN_K: tl.constexpr,
    ):
        """One K tile: the activations (with their prologue) times the tile's weights ``wv``."""
        if EVEN_K:
            xm = m_mask[:, None]
        else:
            xm = m_mask[:, None] & (rk < K)[None, :]
        if PROLOGUE == 2:
            g = tl.load(x_rows + rk[None, :], mask=xm, other=0.0).to(tl.float32)
            u = tl.load(x_rows + K + rk[None, :], mask=xm, other=0.0).to(tl.float32)
            act = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
            xf = (act * u).to(dt).to(tl.float32)
        else:
            xf = tl.load(x_rows + rk[None, :], mask=xm, other=0.0).to(tl.float32)
            if PROLOGUE == 1:
                ss += xf * xf
                if EVEN_K:
                    nw = tl.load(nw_ptr + rk).to(tl.float32)
                else:
                    nw = tl.load(nw_ptr + rk, mask=rk < K, other=0.0).to(tl.float32)
                xf = xf * nw[None, :]
        if BLOCK_M == 1:
            acc += wv.to(tl.float32) * xf
        else:
            acc += xf[:, None, :] * wv.to(tl.float32)[None, :, :]
        return acc, ss

    @triton.jit
    def _gemv_epilogue(
        acc,
        ss,
        b_ptr,
        res_ptr,
        out_ptr,
        rm,
        rn,
        m_mask,
        n_mask,
        K,
        res_stride,
        out_stride,
        eps,
        dt,
        PROLOGUE: tl.constexpr,
        HAS_RES: tl.constexpr,
        HAS_BIAS: tl.constexpr,
    ):
        """RMSNorm's 1/rms, bias, rounding, residual add, store."""
        if PROLOGUE == 1:
            acc = acc * tl.rsqrt(tl.sum(ss, axis=1) / K + eps)[:, None]
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        y = acc.to(dt)
        om = m_mask[:, None] & n_mask[None, :]
        if HAS_RES:
            r = tl.load(res_ptr + rm[:, None] * res_stride + rn[None, :], mask=om, other=0.0)
            y = (r.to(tl.float32) + y.to(tl.float32)).to(dt)
        tl.store(out_ptr + rm[:, None] * out_stride + rn[None, :], y, mask=om)

    @triton.jit
    def _gemv_kernel(
        x_ptr,
        w_ptr,
        out_ptr,
        res_ptr,
        nw_ptr,
        b_ptr,
        part_ptr,
        ticket_ptr,
        M,
        N,
        K,
        x_stride,
        out_stride,
        res_stride,
        eps,
        PROLOGUE: tl.constexpr,
        HAS_RES: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        EVEN_K: tl.constexpr,
        EVEN_N: tl.constexpr,
        USE_PDL: tl.constexpr,
        SPLIT_K: tl.constexpr,
        TRIGGER: tl.constexpr,
    ):
        """out[m, n] = sum_k pro(x)[m, k] * w[n, k] (+ bias[n]) (+ res[m, n]).

        PROLOGUE 0: x as is; 1: RMSNorm(x) with weight nw (K columns); 2: silu(x[:, :K]) * x[:, K:2K].
        One pass over K: the RMSNorm scale 1/rms(x) is a per-row factor, so the sum of squares is
        gathered alongside the dot products and applied at the end. Products are summed elementwise into
        a [BLOCK_M, BLOCK_N, BLOCK_K] accumulator and reduced across K once, after the loop (a reduction
        per iteration costs shuffles and serialises the loads).

        USE_PDL (launched with programmatic dependent launch): the first weight tile is requested
        before waiting for the previous kernel, whose output (x, res) is only read after the wait.

        SPLIT_K > 1 (no RMSNorm prologue; K a multiple of SPLIT_K * BLOCK_K): program (n, s) sums K
        slice s into an fp32 partial; the last of an n block to finish (an atomic ticket says which)
        adds the partials in slice order, so the result does not depend on which finished last, and
        runs the epilogue. More programs stream a short, wide projection's weights at once.

        TRIGGER without USE_PDL: a kernel launched plainly still lets the kernel after it (launched with
        PDL) start its programs while this one's last ones run.
        """
        pid = tl.program_id(0)
        if SPLIT_K > 1:
            k_lo = tl.program_id(1) * (K // SPLIT_K)
            k_hi = k_lo + K // SPLIT_K
        else:
            k_lo = 0
            k_hi = K
        rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        rm = tl.arange(0, BLOCK_M)
        m_mask = rm < M
        n_mask = rn < N
        dt = w_ptr.dtype.element_ty
        x_rows = x_ptr + rm[:, None] * x_stride
        w_rows = w_ptr + rn[:, None].to(tl.int64) * K
        if BLOCK_M == 1:
            acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        else:
            acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], dtype=tl.float32)
        ss = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
        rk = k_lo + tl.arange(0, BLOCK_K)
        wv = _gemv_weights(w_rows, rk, K, n_mask, EVEN_K, EVEN_N)
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
        if USE_PDL or TRIGGER:
            tl.extra.cuda.gdc_launch_dependents()
        acc, ss = _gemv_step(acc, ss, wv, x_rows, nw_ptr, rk, K, m_mask, dt, PROLOGUE, BLOCK_M, EVEN_K)
        for k0 in range(k_lo + BLOCK_K, k_hi, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            wv = _gemv_weights(w_rows, rk, K, n_mask, EVEN_K, EVEN_N)
            acc, ss = _gemv_step(acc, ss, wv, x_rows, nw_ptr, rk, K, m_mask, dt, PROLOGUE, BLOCK_M, EVEN_K)
        if BLOCK_M == 1:
            acc = tl.sum(acc, axis=1)[None, :]
        else:
            acc = tl.sum(acc, axis=2)
        if SPLIT_K > 1:
            # partials [SPLIT_K, n blocks, BLOCK_M, BLOCK_N]; every thread's written before the ticket
            tile = rm[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
            blocks = tl.num_programs(0)
            tl.store(part_ptr + (tl.program_id(1) * blocks + pid) * (BLOCK_M * BLOCK_N) + tile, acc)
            tl.debug_barrier()
            if tl.atomic_add(ticket_ptr + pid, 1) == SPLIT_K - 1:
                acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
                for sk in tl.static_range(SPLIT_K):
                    acc += tl.load(part_ptr + (sk * blocks + pid) * (BLOCK_M * BLOCK_N) + tile, cache_modifier=".cg")
                tl.store(ticket_ptr + pid, 0)  # ready for the next launch
                _gemv_epilogue(
                    acc,
                    ss,
                    b_ptr,
                    res_ptr,
                    out_ptr,
                    rm,
                    rn,
                    m_mask,
                    n_mask,
                    K,
                    res_stride,
                    out_stride,
                    eps,
                    dt,
                    PROLOGUE,
                    HAS_RES,
                    HAS_BIAS,
                )
        else:
            _gemv_epilogue(
                acc,
                ss,
                b_ptr,
                res_ptr,
                out_ptr,
                rm,
                rn,
                m_mask,
                n_mask,
                K,
                res_stride,
                out_stride,
                eps,
                dt,
                PROLOGUE,
                HAS_RES,
                HAS_BIAS,
            )


# (N, K) -> (BLOCK_N, BLOCK_K, num_warps, num_stages[, SPLIT_K]): the best of bench/skinny_bench.py --gemv --sweep
# on an H200 (M = 1); other shapes use pick_config's rule. Qwen3-0.6B's qkv and gate|up (K = 1024) take
# half-K tiles instead: alone they were no faster, but inside the model's PDL chain (bench/ab_decode.py)
# the step was. Each program holds half the registers, so the whole grid is resident in one wave with
# room left for the next kernel's programs to start and issue their loads before their PDL wait. Its o
# and down projections (N = 1024: 128 programs, fewer than the SMs) split K into one tile a program
# (bench/ab_decode.py, variant gemv=...); on Llama-3.1-8B's, with 512 programs already, splitting lost.
TUNED: dict[tuple[int, int], tuple[int, ...]] = {
    (4096, 1024): (8, 512, 4, 2),
    (1024, 2048): (8, 1024, 4, 4, 2),
    (6144, 1024): (8, 512, 4, 2),
    (1024, 3072): (8, 1024, 4, 4, 3),
    (6144, 4096): (8, 1024, 4, 4),
    (4096, 4096): (8, 1024, 4, 4),
    (28672, 4096): (8, 1024, 4, 2),
    (4096, 14336): (8, 1024, 4, 2),
}


def pick_config(n: int, k: int) -> tuple[int, ...]:
    cfg = TUNED.get((n, k))
    if cfg is not None:
        return cfg
    # What won every tuned shape: 8 rows a program, 1024-wide K tiles (wide 16-byte loads in flight).
    return 8, 1024 if k >= 1024 else 256, 4, 2


_split_workspace: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
SPLIT_WORKSPACE = 1 << 16
"""fp32 partials (and int32 tickets) of one split-K launch at most: a launch is done before the next
reads them, so every layer and graph shares one per device."""


def _workspace(device: torch.device, partials: int, blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocated once, outside any graph (the first split launch is an eager warmup): the tickets must
    start at zero and stay where captured graphs point."""
    ws = _split_workspace.get(device)
    if ws is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("split-K GEMV workspace first needed inside a graph capture: warm up eagerly first")
        ws = _split_workspace[device] = (
            torch.empty(SPLIT_WORKSPACE, dtype=torch.float32, device=device),
            torch.zeros(SPLIT_WORKSPACE, dtype=torch.int32, device=device),
        )
    if partials > SPLIT_WORKSPACE or blocks > SPLIT_WORKSPACE:
        raise ValueError(f"split-K GEMV needs {partials} partials, the workspace holds {SPLIT_WORKSPACE}")
    return ws


_SHAPES: dict[tuple, tuple[tuple[int, int], int, int, dict]] = {}
"""(rows, N, K, x's columns, prologue, residual, bias, pdl, trigger, config) -> the launch's shape: worked out
once, since an eager decode step launches the same few shapes ~140 times (bench/eager_launch_bench.py)."""


def _launch_shape(
    m: int,
    n: int,
    k: int,
    x_cols: int,
    prologue: int,
    has_res: bool,
    has_bias: bool,
    pdl: bool,
    trigger: bool,
    config: tuple[int, ...],
) -> tuple[tuple[int, int], int, int, dict]:
    """(grid, split, block_n, the constexprs and launch options) of a ``gemv`` launch."""
    assert m <= MAX_M, f"gemv handles at most {MAX_M} rows, got {m}"
    assert x_cols == (2 * k if prologue == 2 else k), (m, x_cols, n, k, prologue)
    block_n, block_k, warps, stages, *rest = config
    block_m = next_pow2(m)
    if block_m > 1:  # the [M, N, K] accumulator must stay in registers
        block_k = max(64, min(block_k, 8192 // (block_m * block_n)))
    split = rest[0] if rest else 1
    if prologue == 1 or k % (split * block_k):
        split = 1
    meta = dict(
        PROLOGUE=prologue,
        HAS_RES=has_res,
        HAS_BIAS=has_bias,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        EVEN_K=k % block_k == 0,
        EVEN_N=n % block_n == 0,
        USE_PDL=pdl,
        SPLIT_K=split,
        TRIGGER=trigger and not pdl,
        num_warps=warps,
        num_stages=stages,
        launch_pdl=pdl,
    )
    return (cdiv(n, block_n), split), split, block_n, meta


def launch_grid(m: int, n: int, k: int, prologue: int = 0) -> tuple[int, int]:
    """The grid of a ``gemv`` launch of ``m`` rows on an [n, k] weight with its shipped config (prologue: 0 none,
    1 RMSNorm, 2 SiLU·mul), as a profiler trace shows it (bench/profile_decode.py keys its kernels by it)."""
    x_cols = 2 * k if prologue == 2 else k
    return _launch_shape(m, n, k, x_cols, prologue, False, False, False, False, pick_config(n, k))[0]


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    *,
    norm_weight: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
    silu_mul: bool = False,
    residual: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
    config: Optional[tuple[int, ...]] = None,
    pdl: Optional[bool] = None,
    trigger: bool = False,
) -> torch.Tensor:
    """``[residual +] linear(pro(x), weight, bias)`` for x [M <= MAX_M, K'] (rows may be strided).

    ``norm_weight``: pro = RMSNorm; ``silu_mul``: x is [gate | up] (2K columns) and pro = silu(gate) * up.
    ``out`` may be ``residual`` itself (each output element is read and written by one program).
    ``pdl``: launch with programmatic dependent launch (default: ``fused.use_pdl``'s "auto").
    ``trigger``: without ``pdl``, still let a PDL-launched kernel after this one start early.
    ``config``: (block_n, block_k, warps, stages[, split_k]); split-K is skipped where it does not
    apply (an RMSNorm prologue, K not a multiple of split_k * block_k).
    """
    m = x.shape[0]
    n, k = weight.shape
    if out is None:
        out = torch.empty((m, n), dtype=weight.dtype, device=weight.device)
    prologue = 2 if silu_mul else (1 if norm_weight is not None else 0)
    if pdl is None:
        pdl = use_pdl(weight.device, weight.numel() * weight.element_size())
    # the config is picked before the memo: a benchmark may change TUNED between engines (bench/ab_decode.py gemv=)
    cfg = config or pick_config(n, k)
    at = (m, n, k, x.shape[1], prologue, residual is not None, bias is not None, pdl, trigger, cfg)
    shape = _SHAPES.get(at)
    if shape is None:
        shape = _SHAPES[at] = _launch_shape(*at)
    grid, split, block_n, meta = shape
    assert x.stride(-1) == 1 and weight.is_contiguous()
    if split > 1:
        part, tickets = _workspace(weight.device, split * grid[0] * meta["BLOCK_M"] * block_n, grid[0])
    else:
        part, tickets = out, out
    fast(_gemv_kernel)[grid](
        x,
        weight,
        out,
        residual if residual is not None else out,
        norm_weight if norm_weight is not None else weight,
        bias if bias is not None else weight,
        part,
        tickets,
        m,
        n,
        k,
        x.stride(0),
        out.stride(0),
        residual.stride(0) if residual is not None else 0,
        eps,
        **meta,
    )
    return out
