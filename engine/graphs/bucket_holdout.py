"""Advice that generalises: choose buckets on one part of a workload, score them on a later part.

The advisor's search is exact for the steps it is given, which is its weakness on real traffic: 30
requests advised the exact lengths seen (7,10,13,16,22,...), which the next 30 do not hit. So the
demand is split in time (``train``: the earlier steps, ``held``: the later ones, the way traffic
moves on), and:

1. for every candidate ``grid`` (1: any size; else buckets rounded up to multiples of it, such as the
   KV page size or a kernel-friendly tile) the advisor fits a list on ``train`` alone;
2. each fitted list is costed on ``held``, steps it never saw; the grid with the lowest held-out
   cost wins, and among grids within ``tolerance`` of that cost the coarsest (its buckets are the
   ones that keep serving when lengths move a little);
3. the advice is that grid's list fitted on the whole demand (no size seen is dropped), and the
   numbers reported for it are the train/held-out costs of the list fitted on ``train``: an honest
   estimate of how the advice does on steps it has not seen, beside the same two costs for the
   lists in use.

With ``keep_current`` (live advice, auto-tune) the advisor spends a graph only where it saves at
least ``MIN_GRAPH_GAIN`` of the ideal cost, and every fitted list gets its spare graphs filled with
the current list's buckets (``spare_graphs.keep_current``) before it is scored, so the grid choice,
the held-out report and the advice all judge the list that would be captured.

Costs are reported per ideal (``cost ÷ ideal``, 1.0 = every step on a graph of exactly its size), so
a training part and a held-out part of different lengths compare. Pure (numpy via the advisor).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Callable, Mapping, Optional, Sequence

from .bucket_advisor import Advice, advise, expected_cost
from .held_out import HeldOut
from .spare_graphs import keep_current as fill_spare

__all__ = ["DEFAULT_GRIDS", "HeldOut", "advise_held_out", "relative_cost"]

DEFAULT_GRIDS = {"decode": (1, 2, 4, 8), "prefill": (1, 16, 32, 64, 128)}
"""Grids tried per phase: decode batch sizes the kernels tile by, prefill token multiples that the
attention and GEMM tiles like; the KV page size joins the prefill grids when known."""

MIN_GRAPH_GAIN = 0.01
"""With ``keep_current``: a graph the advice takes from the lists in use must save at least this
fraction of the ideal step cost (on average over the graphs past the fewest that do): a window of
short prompts must not trade a dense list's long buckets for a shade less padding."""

DEFAULT_TOLERANCE = 0.01
"""Held-out costs within this fraction of the best count as equal; the coarser grid then wins."""


def relative_cost(
    phase: str,
    demand: Mapping[int, int],
    buckets: Sequence[int],
    *,
    eager_ratio: float,
    max_padding_waste: Optional[float],
) -> float:
    """Cost ÷ ideal of ``demand`` under ``buckets`` (1.0 for no steps: nothing to lose)."""
    ideal = float(sum(s * c for s, c in demand.items()))
    if not ideal:
        return 1.0
    return expected_cost(phase, demand, buckets, eager_ratio=eager_ratio, max_padding_waste=max_padding_waste) / ideal


def advise_held_out(
    phase: str,
    train: Mapping[int, int],
    held: Mapping[int, int],
    *,
    eager_ratio: float,
    grids: Sequence[int] = (1,),
    current: Optional[Sequence[int]] = None,
    tolerance: float = DEFAULT_TOLERANCE,
    max_padding_waste: Optional[float] = None,
    max_graphs: Optional[int] = None,
    max_memory: Optional[float] = None,
    memory_of: Optional[Callable[[int], float]] = None,
    max_bucket: Optional[int] = None,
    largest_at_least: Optional[int] = None,
    keep_current: bool = False,
) -> Advice:
    """The advice for ``train`` + ``held`` (size -> steps), its grid chosen by held-out cost, with a
    ``HeldOut`` report attached (``Advice.held_out``). With no held-out steps there is nothing to
    score on: grid 1, and no report. ``keep_current`` (needs ``current`` and ``max_graphs``): the
    spare graphs keep the current list's buckets (see the module)."""
    grids = sorted(set(grids) | {1})
    if any(g < 1 for g in grids):
        raise ValueError(f"grids must be at least 1, got {grids}")
    budget = dict(
        eager_ratio=eager_ratio,
        max_padding_waste=max_padding_waste,
        max_graphs=max_graphs,
        max_memory=max_memory,
        memory_of=memory_of,
        max_bucket=max_bucket,
        cover_largest=True,
        largest_at_least=largest_at_least,
    )
    whole = Counter(train) + Counter(held)
    keep = list(current) if keep_current and current and max_graphs is not None else None
    if keep is not None:
        budget["min_graph_gain"] = MIN_GRAPH_GAIN

    def filled(buckets: Sequence[int]) -> tuple[int, ...]:
        if keep is None:
            return tuple(buckets)
        return fill_spare(
            buckets,
            keep,
            max_graphs=max_graphs,  # type: ignore[arg-type]
            eager_ratio=eager_ratio,
            max_padding_waste=max_padding_waste,
            max_memory=max_memory,
            memory_of=memory_of,
            max_bucket=max_bucket,
        )

    def final_advice(advice: Advice) -> Advice:
        buckets = filled(advice.buckets)
        if buckets == advice.buckets:
            return advice
        cost = expected_cost(phase, whole, buckets, eager_ratio=eager_ratio, max_padding_waste=max_padding_waste)
        per_bucket = tuple(float(memory_of(b)) for b in buckets) if memory_of is not None else ()
        uncovered = tuple(s for s in advice.uncovered if s > buckets[-1])
        return replace(
            advice,
            buckets=buckets,
            cost=cost,
            memory_bytes=float(sum(per_bucket)) if memory_of is not None else None,
            bucket_memory=per_bucket,
            uncovered=uncovered,
            uncovered_because=advice.uncovered_because if uncovered else "",
        )

    if not sum(held.values()) or not sum(train.values()):
        return final_advice(advise(phase, whole, **budget))  # type: ignore[arg-type]

    def rel(demand: Mapping[int, int], buckets: Sequence[int]) -> float:
        return relative_cost(phase, demand, buckets, eager_ratio=eager_ratio, max_padding_waste=max_padding_waste)

    fits = {g: filled(advise(phase, train, grid=g, **budget).buckets) for g in grids}  # type: ignore[arg-type]
    scores = {g: rel(held, fits[g]) for g in grids}
    best = min(scores.values())
    grid = max(g for g in grids if scores[g] <= best * (1.0 + tolerance))
    report = HeldOut(
        grid=grid,
        train_steps=sum(train.values()),
        held_steps=sum(held.values()),
        fitted=fits[grid],
        advice_train=rel(train, fits[grid]),
        advice_held=scores[grid],
        now_train=None if current is None else rel(train, current),
        now_held=None if current is None else rel(held, current),
        by_grid=tuple(sorted(scores.items())),
    )
    final = final_advice(advise(phase, whole, grid=grid, **budget))  # type: ignore[arg-type]
    return replace(final, held_out=report)
