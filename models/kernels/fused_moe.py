"""The grouped expert GEMM (Triton) of a mixture-of-experts layer, after vLLM's and SGLang's fused_moe.

Why: a sparse layer multiplies each token by the k experts it chose. Looping over the experts costs a pair
of GEMMs per active expert and a host sync to know which are active, which no CUDA graph can hold. Here the
(token, slot) pairs are sorted by expert with each expert's run padded to whole ``BLOCK_M`` row blocks
(models/kernels/moe_align.py, on the device), and one launch per projection computes every block against
its expert's weights: [pairs, 2I] = x[token] @ w13[e].T, SiLU·mul in torch, then [pairs, H] = h @ w2[e].T
scaled by the routing weight in the epilogue; the k slots of a token are summed last. Grid, buffers and
launch arguments depend on the shapes alone (blocks past the routing's total exit at once), so a decode
graph captures at every bucket and replays for any routing.

Accumulation is float32, the output rounded once to the model's dtype (bf16 / fp16: an ulp-level difference
from the torch path's rounding points); float32 weights multiply at full precision (``input_precision``
"ieee", not TF32), so an fp32 model on CUDA agrees with the CPU path to the order of summation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .fused import HAVE_TRITON, cdiv
from .moe_align import align


@dataclass(frozen=True)
class TileConfig:
    """Tile shape of one grouped GEMM launch (``GROUP_M``: row blocks walked together for L2 reuse)."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int


def tile_config(pairs: int, num_experts: int) -> TileConfig:
    """vLLM's untuned defaults: small tiles while there are fewer pairs than experts (decode: most experts get
    one or two rows, a 16-row block is mostly padding already), larger ones past it (prefill)."""
    if pairs <= num_experts:
        return TileConfig(16, 32, 64, 1)
    return TileConfig(64, 64, 32, 8)


if HAVE_TRITON:
    import triton
    import triton.language as tl

    from .launch import fast

    @triton.jit
    def _grouped_gemm_kernel(
        a_ptr,
        b_ptr,
        c_ptr,
        weights_ptr,
        sorted_ids_ptr,
        expert_ids_ptr,
        total_ptr,
        N,
        K,
        rows,
        pairs,
        stride_am,
        stride_be,
        stride_bn,
        stride_cm,
        TOP_K: tl.constexpr,
        MUL_WEIGHT: tl.constexpr,
        IEEE: tl.constexpr,
        EVEN_K: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        GROUP_M: tl.constexpr,
    ):
        """C[p] = A[p // TOP_K] @ B[expert].T (times weights[p] if MUL_WEIGHT) for the pairs p of one row
        block and one column block; A [*, K] row-major, B [E, N, K], C [pairs, N]."""
        pid = tl.program_id(0)
        num_m = tl.cdiv(rows, BLOCK_M)
        num_n = tl.cdiv(N, BLOCK_N)
        in_group = GROUP_M * num_n
        first_m = (pid // in_group) * GROUP_M
        group_size = tl.minimum(num_m - first_m, GROUP_M)
        pid_m = first_m + (pid % in_group) % group_size
        pid_n = (pid % in_group) // group_size
        if pid_m * BLOCK_M >= tl.load(total_ptr):
            return  # past the routing's rows: padding of the grid, not of the work
        offs_id = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        pair = tl.load(sorted_ids_ptr + offs_id).to(tl.int64)
        live = pair < pairs
        expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
        offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64) % N
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + (pair[:, None] // TOP_K) * stride_am + offs_k[None, :]
        b_ptrs = b_ptr + expert * stride_be + offs_n[None, :] * stride_bn + offs_k[:, None]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kk in range(0, tl.cdiv(K, BLOCK_K)):
            if EVEN_K:
                a = tl.load(a_ptrs, mask=live[:, None], other=0.0)
                b = tl.load(b_ptrs)
            else:
                k_left = K - kk * BLOCK_K
                a = tl.load(a_ptrs, mask=live[:, None] & (offs_k[None, :] < k_left), other=0.0)
                b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
            if IEEE:
                acc = tl.dot(a, b, acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b, acc)
            a_ptrs += BLOCK_K
            b_ptrs += BLOCK_K
        if MUL_WEIGHT:
            w = tl.load(weights_ptr + pair, mask=live, other=0.0).to(tl.float32)
            acc = acc * w[:, None]
        offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        c_ptrs = c_ptr + pair[:, None] * stride_cm + offs_cn[None, :]
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=live[:, None] & (offs_cn[None, :] < N))


def _launch(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    weights: torch.Tensor,
    sorted_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    total: torch.Tensor,
    top_k: int,
    mul_weight: bool,
    cfg: TileConfig,
) -> None:
    """One grouped GEMM over the aligned rows: ``c`` [pairs, N] from ``a`` [*, K] and ``b`` [E, N, K]."""
    n, k = b.shape[1], b.shape[2]
    rows = sorted_ids.shape[0]
    grid = (cdiv(rows, cfg.block_m) * cdiv(n, cfg.block_n),)
    fast(_grouped_gemm_kernel)[grid](
        a,
        b,
        c,
        weights,
        sorted_ids,
        expert_ids,
        total,
        n,
        k,
        rows,
        c.shape[0],
        a.stride(0),
        b.stride(0),
        b.stride(1),
        c.stride(0),
        TOP_K=top_k,
        MUL_WEIGHT=mul_weight,
        IEEE=a.dtype == torch.float32,
        EVEN_K=k % cfg.block_k == 0,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m,
    )


def grouped_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    act: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """The experts' output for every row of ``x`` [T, H] (the arguments of ``moe_torch.sorted_experts``), by
    two grouped GEMM launches: no host sync, shapes from ``x`` and the weights alone."""
    t, k = ids.shape
    num_experts, two_i, _ = w13.shape
    pairs = t * k
    cfg = tile_config(pairs, num_experts)
    plan = align(ids, num_experts, cfg.block_m)
    x = x.contiguous()
    flat_weights = weights.reshape(-1).contiguous()
    gate_up = torch.empty((pairs, two_i), dtype=x.dtype, device=x.device)
    _launch(x, w13, gate_up, flat_weights, plan.sorted_ids, plan.expert_ids, plan.total, k, False, cfg)
    gate, up = gate_up.chunk(2, dim=-1)
    hidden = (act(gate) * up).contiguous()
    out = torch.empty((pairs, w2.shape[1]), dtype=x.dtype, device=x.device)
    _launch(hidden, w2, out, flat_weights, plan.sorted_ids, plan.expert_ids, plan.total, 1, True, cfg)
    return out.view(t, k, -1).sum(dim=1)
