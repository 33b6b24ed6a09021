"""Spare graphs keep the lists in use: live advice never throws away coverage it gets for free.

Live advice (``live_advice``, auto-tune) fits a window of recent steps. Such a window has seen one
part of the mix only: fitted alone, the advice for a run of short prompts spends the graph budget on
their exact sizes and drops the middle of a dense list, and when the mix shifts to long prompts they
run eagerly until the next recapture (the workload-shift benchmark measured +35 % step cost against
the engine's dense default lists). Yet the window rarely needs the whole budget: the advisor takes
the fewest graphs at equal cost, so the graphs it leaves unused (``max_graphs`` minus its list) cost
the window nothing. ``keep_current`` gives them back to the current list's buckets, so a proposal
drops a bucket in use only when the window needs its slot (the graph count) or its memory (the
memory budget).

Which of the current buckets keep the spare slots when not all fit: greedily, the one that most
lowers the step cost of an even spread of sizes up to the largest bucket (every size equally likely:
the traffic the window has not seen), under the same padding rule as the runners; ties go to the
larger bucket. So the kept buckets fill the ranges the advice leaves coarse, not the ones it already
serves finely. Pure (numpy).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

__all__ = ["keep_current", "spread_cost"]


def spread_cost(buckets: Sequence[int], top: int, *, eager_ratio: float, max_padding_waste: Optional[float]) -> float:
    """Step cost of one step of every size 1..``top`` under ``buckets`` (the runners' rule: the
    smallest bucket at or above the size, eager where none is or the padding cap refuses it)."""
    sizes = np.arange(1, top + 1, dtype=np.float64)
    if not buckets:
        return float(eager_ratio * sizes.sum())
    b = np.array(sorted(buckets), dtype=np.float64)
    idx = np.searchsorted(b, sizes, side="left")
    has = idx < b.size
    bucket = np.where(has, b[np.minimum(idx, b.size - 1)], np.inf)
    ok = has
    if max_padding_waste is not None:
        ok = ok & ((bucket - sizes) / np.where(has, bucket, 1.0) <= max_padding_waste)
    return float(np.where(ok, bucket, eager_ratio * sizes).sum())


def keep_current(
    advised: Sequence[int],
    current: Sequence[int],
    *,
    max_graphs: int,
    eager_ratio: float,
    max_padding_waste: Optional[float] = None,
    max_memory: Optional[float] = None,
    memory_of: Optional[Callable[[int], float]] = None,
    max_bucket: Optional[int] = None,
) -> tuple[int, ...]:
    """``advised`` with its spare graphs (``max_graphs`` minus its buckets) given to ``current``'s
    buckets, chosen greedily (see the module), each only while ``max_memory`` (per ``memory_of``)
    still holds the list. The advised buckets are all kept."""
    chosen = set(advised)
    pool = sorted(b for b in set(current) - chosen if max_bucket is None or b <= max_bucket)
    if not pool or len(chosen) >= max_graphs:
        return tuple(sorted(chosen))
    top = max(chosen | set(pool))
    memory = sum(memory_of(b) for b in chosen) if memory_of is not None else 0.0
    budget = np.inf if max_memory is None or memory_of is None else float(max_memory)
    while pool and len(chosen) < max_graphs:
        fits = [b for b in pool if memory + (memory_of(b) if memory_of is not None else 0.0) <= budget]
        if not fits:
            break
        scored = [
            (spread_cost(sorted(chosen | {b}), top, eager_ratio=eager_ratio, max_padding_waste=max_padding_waste), -b)
            for b in fits
        ]
        _, neg = min(scored)
        pick = -neg
        chosen.add(pick)
        pool.remove(pick)
        memory += memory_of(pick) if memory_of is not None else 0.0
    return tuple(sorted(chosen))
