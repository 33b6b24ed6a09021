"""The bucket advisor: the bucket list that minimises the expected cost of the observed step sizes.

Cost model, per step, in rows (decode) or tokens (prefill):

* a step of size ``s`` that replays bucket ``b`` costs ``b``: its ``s`` real rows and ``b - s``
  padded ones;
* a step that runs eagerly costs ``R * s``, where ``R`` is the eager step time over the graph step
  time (measured from a trace by ``graphs.bucket_demand``; the caller decides);

so a list's expected cost is the sum over observed sizes of ``count * cost``, and the ideal (every
step a perfect-fit graph) is the sum of ``count * s``. Which bucket serves a size, and when the
prefill padding cap refuses it (the step then runs eagerly: the policy never tries a larger bucket),
are ``bucket_policy``'s rules: ``expected_cost`` asks ``BucketPolicy.decide`` itself and the search
below uses the same ``within_padding_cap``, so the advice predicts what the runners will do.

The search is exact over lists drawn from the observed sizes (up to ``max_bucket``): lowering a
bucket to the largest size it serves never costs more and only reduces padding, so with per-bucket
memory that grows with the bucket no other size can do better. Dynamic programming over the sorted
distinct sizes: a state is (buckets chosen, largest of them); the sizes between two consecutive
buckets are served by the upper one or, where the cap refuses, run eagerly, and the sizes above the
largest bucket run eagerly. With a memory budget each state keeps the Pareto front of (memory, cost)
over the choices that reach it (exact for a real-valued budget); without one, memory is not tracked
and a front is a single point. The work is O(max_graphs * n^2) in vector operations for n candidate
sizes, so past ``MAX_CANDIDATES`` distinct sizes the buckets are drawn from that many of them, spread
evenly over the sorted sizes with the largest kept (every size is still costed): the advice is then
the best such list, no longer provably the best of all.
Among lists of equal cost the advice takes the fewest graphs, then the least memory. With a ``grid``
the buckets are multiples of it (the page size, a kernel-friendly tile): every asked size contributes
the grid point just above it as a candidate, and the same exact search runs over those.

With ``cover_largest`` (what ``graphtop advise``, the dashboard and auto-tune ask) the list must
serve the largest size the workload asked for (up to ``max_bucket``): a size the trace needed is
never left to the eager path to save a graph, unless graphs do not pay at all (an eager ratio of 1
or less) or no such list fits the budgets. Then the cheapest list is advised and ``uncovered`` /
``uncovered_because`` name the sizes left above its largest bucket and which budget forced it.

Pure (numpy, no torch): the CLI and the dashboard call it without loading the inference stack.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from .bucket_policy import BucketPolicy, within_padding_cap
from .held_out import HeldOut

__all__ = ["Advice", "advise", "expected_cost"]

MAX_CANDIDATES = 1024
"""Candidate bucket sizes the search weighs at most (see the module docstring)."""
_REL_TIE = 1e-9  # costs this close (relative) count as equal, so ties go to fewer graphs


@dataclass(frozen=True)
class Advice:
    """The advised buckets of one phase and what they cost under the model."""

    phase: str
    buckets: tuple[int, ...]
    cost: float  # expected cost of the observed steps, rows or tokens
    ideal: float  # every step a perfect-fit graph
    memory_bytes: Optional[float]  # estimated graph memory of the list; None when not estimated
    bucket_memory: tuple[Optional[float], ...] = ()  # per bucket, as ``buckets``; empty when not estimated
    uncovered: tuple[int, ...] = ()  # asked-for sizes above the largest bucket (they run eagerly)
    uncovered_because: str = ""  # the budget that left them uncovered; "" when none was asked to cover
    held_out: Optional[HeldOut] = None  # train / held-out costs (``bucket_holdout``); None: not scored

    @property
    def relative_cost(self) -> Optional[float]:
        """Cost over the ideal: 1.0 is every step on a graph of exactly its size."""
        return self.cost / self.ideal if self.ideal else None


def expected_cost(
    phase: str,
    demand: Mapping[int, int],
    buckets: Sequence[int],
    *,
    eager_ratio: float,
    max_padding_waste: Optional[float] = None,
) -> float:
    """Expected cost of ``demand`` (size -> steps) under ``buckets``, each step decided by the policy."""
    policy = BucketPolicy.of(phase, buckets, max_padding_waste=max_padding_waste)
    total = 0.0
    for size, count in demand.items():
        d = policy.decide(size)
        total += count * (d.bucket if d.graph and d.bucket is not None else eager_ratio * size)
    return total


@dataclass
class _Level:
    """Every label with the same number of buckets, ordered by their largest bucket (``state``)."""

    state: np.ndarray  # index of the largest bucket's size; -1: no bucket yet
    memory: np.ndarray
    cost: np.ndarray  # cost of the sizes up to the state's bucket
    back: np.ndarray  # index of the label one bucket down; -1 at the start


def advise(
    phase: str,
    demand: Mapping[int, int],
    *,
    eager_ratio: float,
    max_padding_waste: Optional[float] = None,
    max_graphs: Optional[int] = None,
    max_memory: Optional[float] = None,
    memory_of: Optional[Callable[[int], float]] = None,
    max_bucket: Optional[int] = None,
    cover_largest: bool = False,
    grid: int = 1,
    largest_at_least: Optional[int] = None,
    min_graph_gain: Optional[float] = None,
) -> Advice:
    """The cheapest list for ``demand`` (size -> steps) with at most ``max_graphs`` buckets, no bucket
    over ``max_bucket`` and, with ``max_memory``, an estimated memory (``memory_of`` per bucket) within
    it. ``memory_of`` alone only reports the advice's memory. ``cover_largest``: see the module.
    ``grid``: buckets are multiples of it (or ``max_bucket``), each the smallest such point at or
    above some asked size; the search stays exact over those candidates. ``largest_at_least`` (with
    ``cover_largest``): the largest bucket is at least this, even if no step asked for it (live
    advice keeps the largest bucket in use, for the long request the window has not seen yet).
    ``min_graph_gain``: the advice spends a graph only where it pays, its graphs past the first ``k``
    saving at least this fraction of the ideal cost each on average (live advice gives the graphs
    left over to the lists in use: ``spare_graphs``)."""
    if eager_ratio <= 0:
        raise ValueError(f"eager ratio must be positive, got {eager_ratio}")
    if max_memory is not None and memory_of is None:
        raise ValueError("a memory budget needs per-bucket memory estimates")
    if grid < 1:
        raise ValueError(f"grid must be at least 1, got {grid}")
    asked = sorted(s for s, c in demand.items() if c > 0)
    allowed = {_round_up(s, grid, max_bucket) for s in asked}  # grid 1: the asked sizes themselves
    if cover_largest and largest_at_least is not None and asked:
        floor = largest_at_least if max_bucket is None else min(largest_at_least, max_bucket)
        allowed.add(max(floor, 1))
    sizes = sorted(set(asked) | allowed)  # a grid point nobody asked for costs nothing: count 0
    counts = np.array([demand.get(s, 0) for s in sizes], dtype=np.float64)
    x = np.array(sizes, dtype=np.float64)
    n = len(sizes)
    count_sum = np.concatenate(([0.0], np.cumsum(counts)))
    eager_sum = np.concatenate(([0.0], np.cumsum(counts * x * eager_ratio)))
    ideal = float(np.dot(counts, x))
    cand = _thin([j for j in range(n) if sizes[j] in allowed and (max_bucket is None or sizes[j] <= max_bucket)])
    limit = len(cand) if max_graphs is None else min(max_graphs, len(cand))
    track_memory = max_memory is not None and memory_of is not None
    step = _Step(
        x,
        count_sum,
        eager_sum,
        np.array(cand, dtype=np.int64),
        np.array([_first_served(sizes, j, max_padding_waste) for j in cand], dtype=np.int64),
        np.array([float(memory_of(sizes[j])) if track_memory else 0.0 for j in cand]),  # type: ignore[misc]
        np.inf if max_memory is None else float(max_memory),
    )
    levels = [_Level(np.array([-1]), np.array([0.0]), np.array([0.0]), np.array([-1]))]
    for _ in range(limit):
        nxt = step.extend(levels[-1])
        if nxt is None:
            break
        levels.append(nxt)

    top = cand[-1] if cand and cover_largest and eager_ratio > 1 else None  # the size that must be a bucket
    if min_graph_gain is not None:
        levels = levels[: _lean_count(levels, eager_sum, n, top, min_graph_gain * ideal) + 1]
    best = _best(levels, eager_sum, n, top) if top is not None else None
    if best is None:  # no list that covers fits the budgets: the cheapest one, and say why
        best = _best(levels, eager_sum, n, None)
    assert best is not None  # level 0 always has the empty list
    total, k, _, i = best
    chosen: list[int] = []
    while k > 0:
        chosen.append(sizes[int(levels[k].state[i])])
        i = int(levels[k].back[i])
        k -= 1
    buckets = tuple(sorted(chosen))
    per_bucket = tuple(float(memory_of(b)) for b in buckets) if memory_of is not None else ()
    mem_total = float(sum(per_bucket)) if memory_of is not None else None
    uncovered: tuple[int, ...] = ()
    because = ""
    if cover_largest and eager_ratio > 1:
        uncovered = tuple(s for s in asked if not buckets or s > buckets[-1])
        if uncovered:
            because = _why_uncovered(buckets, top, sizes, max_graphs)
    return Advice(phase, buckets, total, ideal, mem_total, per_bucket, uncovered, because)


def _best(
    levels: Sequence["_Level"], eager_sum: np.ndarray, n: int, top: Optional[int]
) -> Optional[tuple[float, int, float, int]]:
    """The cheapest label (total, graphs, memory, label), among those whose largest bucket is the
    size index ``top`` when given; None when there is none."""
    best: Optional[tuple[float, int, float, int]] = None
    for k, level in enumerate(levels):
        tails = eager_sum[n] - eager_sum[level.state + 1]
        for i, total in enumerate(level.cost + tails):
            if top is not None and int(level.state[i]) != top:
                continue
            key = (float(total), k, float(level.memory[i]), i)
            if best is None or _better(key, best):
                best = key
    return best


def _lean_count(levels: Sequence["_Level"], eager_sum: np.ndarray, n: int, top: Optional[int], per_graph: float) -> int:
    """The fewest graphs ``k`` such that the graphs past it save less than ``per_graph`` each on
    average: the cheapest list of up to ``k`` graphs costs at most ``per_graph * (K - k)`` more than
    the cheapest of up to ``K`` (robust to a gain curve that is not convex). Lists that do not cover
    ``top`` count only where none at that graph count does."""
    best = []
    for level in levels:
        total = level.cost + (eager_sum[n] - eager_sum[level.state + 1])
        if top is not None and (level.state == top).any():
            total = total[level.state == top]
        best.append(float(total.min()) if total.size else np.inf)
    upto = np.minimum.accumulate(np.array(best))
    last = len(levels) - 1
    for k in range(last + 1):
        if upto[k] - upto[last] <= per_graph * (last - k) * (1.0 + _REL_TIE):
            return k
    return last


def _why_uncovered(buckets: Sequence[int], top: Optional[int], sizes: Sequence[int], max_graphs: Optional[int]) -> str:
    """Which budget left sizes above the advice's largest bucket, in words for the report. Without a
    memory budget a covering list always exists (one graph of the largest allowed size), so past the
    ``max_bucket`` and graph-count cases only the memory budget can be the cause."""
    if top is None or (buckets and buckets[-1] == sizes[top]):
        return "larger than the largest bucket allowed"
    if max_graphs == 0:
        return "the graph budget is 0"
    return "the graph memory budget cannot hold a bucket this large"


@dataclass
class _Step:
    """Adds one bucket to every label of a level: the DP's transition, over all candidate buckets."""

    x: np.ndarray  # the sorted distinct sizes
    count_sum: np.ndarray  # prefix sums of the step counts
    eager_sum: np.ndarray  # prefix sums of the eager costs
    cand: np.ndarray  # indices of the sizes that may be buckets
    served_from: np.ndarray  # per candidate: the first size index its padding rule lets it serve
    memory: np.ndarray  # per candidate: its memory (all 0 without a budget)
    budget: float

    def segment(self, state: np.ndarray, c: np.ndarray, lo_rule: np.ndarray) -> np.ndarray:
        """Cost of the sizes after ``state`` up to candidate ``c``: served by it, or eager where the
        padding rule refuses (arrays broadcast: labels by candidates)."""
        first = state + 1
        lo = np.maximum(first, lo_rule)
        return (self.eager_sum[lo] - self.eager_sum[first]) + self.x[c] * (self.count_sum[c + 1] - self.count_sum[lo])

    def extend(self, prev: _Level) -> Optional[_Level]:
        if np.isinf(self.budget):
            return self._extend_cheapest(prev)
        parts = []
        for c, lo_rule, mem_c in zip(self.cand, self.served_from, self.memory):
            p = int(np.searchsorted(prev.state, c))  # labels whose largest bucket is below size c
            if p == 0:
                continue
            cost = prev.cost[:p] + self.segment(prev.state[:p], c, lo_rule)
            mem = prev.memory[:p] + mem_c
            keep = _pareto(mem, cost, self.budget)
            if keep.size:
                parts.append((np.full(keep.size, c), mem[keep], cost[keep], keep))
        if not parts:
            return None
        return _Level(*(np.concatenate(a) for a in zip(*parts)))

    def _extend_cheapest(self, prev: _Level) -> Optional[_Level]:
        """Without a memory budget each front is one point: the cheapest predecessor of every
        candidate, for all candidates at once (labels by candidates)."""
        below = prev.state[:, None] < self.cand[None, :]
        cost = prev.cost[:, None] + self.segment(prev.state[:, None], self.cand[None, :], self.served_from[None, :])
        cost = np.where(below, cost, np.inf)
        back = np.argmin(cost, axis=0)
        best = cost[back, np.arange(self.cand.size)]
        ok = np.isfinite(best)
        if not ok.any():
            return None
        return _Level(self.cand[ok], prev.memory[back[ok]] + self.memory[ok], best[ok], back[ok])


def _round_up(size: int, grid: int, max_bucket: Optional[int]) -> int:
    """The smallest multiple of ``grid`` at or above ``size``; ``max_bucket`` where that passes it
    (a size past ``max_bucket`` keeps itself and is no candidate)."""
    point = -(-size // grid) * grid
    if max_bucket is not None and size <= max_bucket < point:
        return max_bucket
    return point


def _thin(cand: list[int]) -> list[int]:
    """At most ``MAX_CANDIDATES`` of the candidate sizes, spread evenly over them, the largest kept:
    the work and memory grow with the square of the candidates."""
    if len(cand) <= MAX_CANDIDATES:
        return cand
    picks = np.unique(np.linspace(0, len(cand) - 1, MAX_CANDIDATES).round().astype(np.int64))
    return [cand[int(i)] for i in picks]


def _first_served(sizes: Sequence[int], j: int, cap: Optional[float]) -> int:
    """Index of the smallest size the bucket ``sizes[j]`` may serve: the padding rule is monotone in
    the size, so the served sizes up to ``j`` are a run ending at ``j`` (binary search on the rule)."""
    lo, hi = 0, j
    while lo < hi:
        mid = (lo + hi) // 2
        if within_padding_cap(sizes[j], sizes[mid], cap):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _pareto(memory: np.ndarray, cost: np.ndarray, budget: float) -> np.ndarray:
    """Indices of the labels within ``budget`` that no other label beats on both memory and cost."""
    order = np.lexsort((cost, memory))
    order = order[memory[order] <= budget]
    if order.size == 0:
        return order
    c = cost[order]
    prior_best = np.concatenate(([np.inf], np.minimum.accumulate(c)[:-1]))
    return order[c < prior_best]


def _better(a: tuple[float, int, float, int], b: tuple[float, int, float, int]) -> bool:
    """Lower cost; at (nearly) equal cost fewer graphs, then less memory."""
    tol = _REL_TIE * max(1.0, abs(b[0]))
    if a[0] < b[0] - tol:
        return True
    if a[0] > b[0] + tol:
        return False
    return (a[1], a[2]) < (b[1], b[2])
