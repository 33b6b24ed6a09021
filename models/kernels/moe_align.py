"""Where each (token, slot) pair goes in the grouped expert GEMM: sorted by expert, each expert's run padded
to whole blocks of ``block`` rows (vLLM's and SGLang's ``moe_align_block_size``), computed on the device.

Why on the device, in torch ops of fixed shapes: the grouped GEMM's grid and buffers must not depend on the
routing, so a decode graph captured at any bucket replays for every routing with no host sync. The sizes
are bounds known from the shape alone: ``n = T * k`` pairs; at most ``min(n, E)`` experts are hit, each
padded by fewer than ``block`` rows, so ``n + min(n, E) * (block - 1)`` rows (rounded up to a block) hold
any routing. The blocks past the routing's own total (``total``, on the device) are skipped by the kernel.

No sort, no ``bincount``, no ``nonzero``: a pair's place within its expert's run is the count of earlier
pairs of the same expert (a cumulative sum over an [n, E] comparison, int32), so the result is the same,
deterministic one on CPU and GPU, which is what lets the CPU tests check this index math.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Alignment:
    """``sorted_ids`` [rows] int32: flat pair indices (``t * k + slot``) in expert order, ``n`` in padding
    rows; ``expert_ids`` [rows / block] int32: the expert of each block; ``total`` [1] int32: rows used."""

    sorted_ids: torch.Tensor
    expert_ids: torch.Tensor
    total: torch.Tensor


def padded_rows(pairs: int, num_experts: int, block: int) -> int:
    """Rows that hold any routing of ``pairs`` (token, slot) pairs over ``num_experts``, whole blocks."""
    bound = pairs + min(pairs, num_experts) * (block - 1)
    return -(-bound // block) * block


def align(ids: torch.Tensor, num_experts: int, block: int) -> Alignment:
    """The grouped GEMM's row order for routing ``ids`` [T, k] (module docstring)."""
    flat = ids.reshape(-1)
    n = flat.shape[0]
    experts = torch.arange(num_experts, device=flat.device, dtype=flat.dtype)
    hit = flat[:, None] == experts[None, :]  # [n, E]
    running = hit.to(torch.int32).cumsum(0, dtype=torch.int32)  # [n, E]: pairs of each expert so far
    rank = running.gather(1, flat[:, None].long())[:, 0] - 1  # place within its expert's run
    counts = running[-1] if n else torch.zeros(num_experts, dtype=torch.int32, device=flat.device)
    padded = (counts + (block - 1)) // block * block
    ends = padded.cumsum(0, dtype=torch.int32)
    starts = ends - padded
    rows = padded_rows(n, num_experts, block)
    sorted_ids = torch.full((rows,), n, dtype=torch.int32, device=flat.device)
    position = (starts.gather(0, flat.long()) + rank).long()
    sorted_ids.scatter_(0, position, torch.arange(n, dtype=torch.int32, device=flat.device))
    block_starts = torch.arange(0, rows, block, dtype=torch.int32, device=flat.device)
    # a block's expert: how many experts' runs end at or before its first row (empty runs end where they start)
    expert_ids = (ends[None, :] <= block_starts[:, None]).sum(1, dtype=torch.int32)
    expert_ids.clamp_(max=num_experts - 1)  # blocks past ``total``: never read, kept a valid index
    return Alignment(sorted_ids, expert_ids, ends[-1:].clone())
