"""Stream-K work split for the skinny GEMM (``skinny_kernels._streamk_kernel``): which (column slab, K tile)
units each program takes and where each slab's partial sums are, computed on the host once per shape.

Why: a split-K launch has N / BLOCK_N x SPLIT programs, which for some projections leaves SMs idle
(96 column slabs on 132 SMs) or makes a second, partial wave; stream-K gives every program the same
number of units whatever the slab count, and the slab's last program sums its segments in K order, so
the result does not depend on which program finishes first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def stream_k_programs(split: int, sms: int, units: int) -> int:
    """Programs of a stream-K launch (config split <= 0): -split per SM (at least one), at most one per unit."""
    return min(units, sms * max(1, -split))


@dataclass(frozen=True)
class StreamKPlan:
    """Which units each program of a stream-K launch takes, and where each slab's segments are.

    ``programs`` [P, 3] int32: first unit, end unit, first segment; ``slabs`` [S, 2] int32: first
    segment, segment count. Built once per shape and device, outside graphs, and kept (a graph reads
    them at replay)."""

    programs: torch.Tensor
    slabs: torch.Tensor
    segments: int


def stream_k_split(slabs: int, tiles: int, programs: int) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
    """The stream-K split on the host: program p takes units [p*U//P, (p+1)*U//P) of the U = slabs * tiles
    (column slab, K tile) units in slab-major order; cut at slab boundaries they give the segments,
    numbered in unit order. Returns (first unit, end unit, first segment) per program and (first
    segment, count) per slab."""
    units = slabs * tiles
    progs: list[tuple[int, int, int]] = []
    per_slab = [[0, 0] for _ in range(slabs)]
    seg = 0
    for p in range(programs):
        u0, u1 = p * units // programs, (p + 1) * units // programs
        progs.append((u0, u1, seg))
        u = u0
        while u < u1:
            slab = u // tiles
            if per_slab[slab][1] == 0:
                per_slab[slab][0] = seg
            per_slab[slab][1] += 1
            seg += 1
            u = min(u1, (slab + 1) * tiles)
    return progs, [(f, c) for f, c in per_slab]


_STREAM_K_PLANS: dict[tuple[torch.device, int, int, int], StreamKPlan] = {}


def stream_k_plan(device: torch.device, slabs: int, tiles: int, programs: int) -> StreamKPlan:
    """The split as device tables, cached per shape and device (a captured graph keeps reading them)."""
    key = (device, slabs, tiles, programs)
    plan = _STREAM_K_PLANS.get(key)
    if plan is None:
        progs, per_slab = stream_k_split(slabs, tiles, programs)
        plan = StreamKPlan(
            torch.tensor(progs, dtype=torch.int32, device=device),
            torch.tensor(per_slab, dtype=torch.int32, device=device),
            per_slab[-1][0] + per_slab[-1][1],
        )
        _STREAM_K_PLANS[key] = plan
    return plan
