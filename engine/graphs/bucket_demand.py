"""What a recorded workload asked of each phase's bucket list: the bucket advisor's inputs from steps.

* **Demand**: the sizes (decode batch sizes, prefill token counts) of every step a captured bucket
  could have served (``bucket_policy.bucket_could_serve``), with their counts: graph steps,
  bucket-list fallbacks, and steps that ran eagerly because their bucket was not captured yet
  (``not_yet_captured``, ``kernels_compiling``, ``recapture_in_progress``) or failed to capture. A
  2,048-token chunk that ran eagerly while the first capture ran is demand like any other: leaving
  it out once advised a list whose largest bucket sent every later such chunk down the eager path.
  The other steps (context wider than the graph, a phase without graphs) stay eager under any
  list; they are counted apart.
* **Eager ratio** R, an eager step's time over a graph step's (the advisor charges an eager step
  ``R * size``). A step's time is its host time, or its replay time when that is longer (under the
  overlap schedule a graph step's host time is only its launch). Measured, in order of preference:
  at the sizes the trace ran both ways (median of the per-size ratios of medians); else over the
  phase, per row or token (eager time / size against graph time / bucket); else
  ``DEFAULT_EAGER_RATIO``. Emulated graph steps never count: their timings are not CUDA graphs'.
* **Memory** per bucket: the capture ledger's, interpolated (``capture.estimate_cost``).

Pure: no torch. ``advise_phase`` is what ``graphtop advise`` and the dashboard's bucket editor call,
so both give the same advice for the same steps.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from ..telemetry.capture import BucketCost, cost_points, estimate_cost
from ..telemetry.events import StepEvent
from ..telemetry.step_size import PREFILL, step_key, step_phase
from .bucket_advisor import Advice
from .bucket_holdout import DEFAULT_GRIDS, advise_held_out
from .bucket_policy import BucketPolicy, bucket_could_serve

__all__ = [
    "DEFAULT_EAGER_RATIO",
    "DEFAULT_HOLDOUT",
    "MAX_EAGER_RATIO",
    "EagerRatio",
    "PhaseDemand",
    "advise_phase",
    "eager_ratio",
    "grids_for",
    "held_out_cut",
    "phase_demand",
    "step_time_ms",
]

MAX_EAGER_RATIO = 1000.0
"""The largest eager/graph ratio taken, given or measured: past it a trace's timings are broken (a
host time of 1e-300 ms), not a graph that fast."""

DEFAULT_HOLDOUT = 0.25
"""The later fraction of a phase's steps held out to choose and score the advice on."""
MIN_HELD_OUT = 4
"""Fewer held-out steps than this score nothing: the whole trace is fitted, at grid 1."""

DEFAULT_EAGER_RATIO = {"decode": 4.0, "prefill": 1.5}
"""Without a measurement: conservative, below the eager/graph ratios that bench/graph_bench.py measures
(docs/benchmarks.md) for the small decode batches and short prefills where graphs matter most."""


@dataclass(frozen=True)
class EagerRatio:
    value: float
    source: str  # how it was found, for the report

    @property
    def measured(self) -> bool:
        return not self.source.startswith("default")


@dataclass(frozen=True)
class PhaseDemand:
    phase: str
    sizes: dict[int, int]  # size -> steps a bucket could serve
    fixed_eager: int  # steps that stay eager under any list (context wider than the graph, ...)
    ratio: EagerRatio

    @property
    def steps(self) -> int:
        return sum(self.sizes.values()) + self.fixed_eager


def step_time_ms(step: StepEvent) -> float:
    """A step's time: its host time, or its replay time when that is longer."""
    return max(step.host_ms, step.replay_ms or 0.0)


def eager_ratio(steps: Iterable[StepEvent], phase: str) -> EagerRatio:
    """Eager step time over graph step time for ``phase``, from real (not emulated) timings."""
    graph: dict[int, list[float]] = defaultdict(list)
    eager: dict[int, list[float]] = defaultdict(list)
    graph_per_row: list[float] = []
    eager_per_row: list[float] = []
    for s in steps:
        if step_phase(s.phase) != phase or step_time_ms(s) <= 0:
            continue
        size = step_key(s.phase, s.batch_size, s.num_tokens)
        if s.path == "graph":
            if s.emulated or not s.bucket:
                continue
            graph[size].append(step_time_ms(s))
            graph_per_row.append(step_time_ms(s) / s.bucket)
        elif size > 0:
            eager[size].append(step_time_ms(s))
            eager_per_row.append(step_time_ms(s) / size)
    both = sorted(set(graph) & set(eager))
    if both:
        ratios = [statistics.median(eager[n]) / statistics.median(graph[n]) for n in both]
        measured = EagerRatio(statistics.median(ratios), f"measured at {len(both)} size(s) run both ways")
    elif graph_per_row and eager_per_row:
        value = statistics.median(eager_per_row) / statistics.median(graph_per_row)
        measured = EagerRatio(value, "measured per row over the phase (no size ran both ways)")
    else:
        return EagerRatio(DEFAULT_EAGER_RATIO[phase], "default")
    if math.isfinite(measured.value) and 0 < measured.value <= MAX_EAGER_RATIO:
        return measured
    return EagerRatio(
        DEFAULT_EAGER_RATIO[phase], f"default: the measured {measured.value:.3g} is outside (0, {MAX_EAGER_RATIO:g}]"
    )


def phase_demand(
    steps: Iterable[StepEvent],
    phase: str,
    current: Optional[Sequence[int]] = None,
    max_padding_waste: Optional[float] = None,
) -> PhaseDemand:
    """The sizes ``phase``'s steps asked for; ``current`` (the list in use) only judges steps whose
    fallback reason is unknown."""
    steps = [s for s in steps if step_phase(s.phase) == phase]
    policy = (
        None
        if current is None
        else BucketPolicy.of(phase, current, max_padding_waste=max_padding_waste if phase == PREFILL else None)
    )
    sizes: Counter[int] = Counter()
    fixed = 0
    for s in steps:
        size = step_key(s.phase, s.batch_size, s.num_tokens)
        if size > 0 and bucket_could_serve(s.path == "graph", s.fallback_reason, size, policy):
            sizes[size] += 1
        else:
            fixed += 1
    return PhaseDemand(phase, dict(sizes), fixed, eager_ratio(steps, phase))


def grids_for(phase: str, page_size: Optional[int] = None) -> tuple[int, ...]:
    """The grids the held-out choice tries for ``phase``: ``DEFAULT_GRIDS``, and for prefill the KV
    page size when known (a bucket of whole pages)."""
    grids = set(DEFAULT_GRIDS[phase])
    if phase == PREFILL and page_size is not None and page_size > 1:
        grids.add(page_size)
    return tuple(sorted(grids))


def held_out_cut(n: int, holdout: float) -> int:
    """Where a phase's ``n`` steps split: the first ``cut`` train, the rest are held out. No split
    (``n``) when the held-out part would have fewer than ``MIN_HELD_OUT`` steps."""
    if not 0.0 <= holdout < 1.0:
        raise ValueError(f"the held-out fraction must be in [0, 1), got {holdout}")
    held = int(round(n * holdout))
    return n if held < MIN_HELD_OUT or held >= n else n - held


def advise_phase(
    steps: Sequence[StepEvent],
    phase: str,
    *,
    costs: Sequence[BucketCost] = (),
    max_padding_waste: Optional[float] = None,
    current: Optional[Sequence[int]] = None,
    max_graphs: Optional[int] = None,
    max_memory: Optional[float] = None,
    max_bucket: Optional[int] = None,
    ratio: Optional[float] = None,
    holdout: float = DEFAULT_HOLDOUT,
    page_size: Optional[int] = None,
    keep_largest: bool = False,
    keep_current: bool = False,
) -> tuple[Advice, PhaseDemand]:
    """The advised list for ``phase`` and the demand it answers. ``ratio`` overrides the measured
    eager ratio; a memory budget needs capture costs of the phase (ValueError otherwise).

    The steps are taken in order: the last ``holdout`` of them are held out, the grid is chosen on
    them (``bucket_holdout``) and ``Advice.held_out`` reports train and held-out costs, for the
    advice and for ``current``. ``holdout`` 0 (or too few steps) fits every step at grid 1.
    ``keep_largest``: the advice's largest bucket is at least ``current``'s (live advice: a window of
    recent steps has not seen every long request). ``keep_current`` (with ``max_graphs``): the graphs
    the advice leaves spare keep ``current``'s buckets (``spare_graphs``: live advice never throws
    away coverage the window does not need the slot for)."""
    mine = [s for s in steps if step_phase(s.phase) == phase]
    cut = held_out_cut(len(mine), holdout)
    demand = phase_demand(mine, phase, current, max_padding_waste)
    train = phase_demand(mine[:cut], phase, current, max_padding_waste).sizes
    held = phase_demand(mine[cut:], phase, current, max_padding_waste).sizes
    if ratio is not None:
        demand = PhaseDemand(phase, demand.sizes, demand.fixed_eager, EagerRatio(ratio, "given"))
    points = cost_points(costs, phase)
    if max_memory is not None and not points:
        raise ValueError(f"no {phase} capture costs in the steps' source: graph memory cannot be estimated")

    def memory_of(bucket: int) -> float:
        value = estimate_cost(points, bucket)
        return 0.0 if value is None else value

    advice = advise_held_out(
        phase,
        train,
        held,
        eager_ratio=demand.ratio.value,
        grids=grids_for(phase, page_size),
        current=current,
        max_padding_waste=max_padding_waste if phase == PREFILL else None,
        max_graphs=max_graphs,
        max_memory=max_memory,
        memory_of=memory_of if points else None,
        max_bucket=max_bucket,
        largest_at_least=max(current) if keep_largest and current else None,
        keep_current=keep_current,
    )
    return advice, demand
