"""A recapture from request to result: what it was estimated to cost, what it took, where it stands.

The estimate is taken when the recapture is requested, from the capture ledger's measured per-bucket
times (``telemetry.capture.estimate_cost``, as the bucket editor's what-if computes it), before the
recapture's own measurements replace them. What it then took is reported two ways, because they
differ a lot while the engine serves: the capture work (the per-bucket times, what the estimate
predicts) and the wall time from start to finish (capture runs in slices between steps, so a busy
engine stretches it). Folded from events only, so a replay or an attached dashboard shows the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

from .capture import BucketCost, cost_points, estimate_cost
from .events import (
    CaptureProgress,
    CaptureStarted,
    RecaptureFinished,
    RecaptureRequested,
)

__all__ = ["RecaptureRun", "RecaptureTracker", "estimate_capture_seconds"]


def estimate_capture_seconds(costs: Iterable[BucketCost], lists: dict[str, Iterable[int]]) -> Optional[float]:
    """Capture work for ``lists`` (phase -> buckets) from measured costs; None when some phase has
    no measurement to go by."""
    costs = list(costs)
    total = 0.0
    for phase, buckets in lists.items():
        points = cost_points(costs, phase, "seconds")
        for b in buckets:
            value = estimate_cost(points, b)
            if value is None:
                return None
            total += value
    return total


@dataclass
class RecaptureRun:
    """One recapture: requested (``started`` False), capturing, or finished."""

    lists: dict[str, tuple[int, ...]]
    estimate_s: Optional[float] = None
    started: bool = False
    buckets_total: int = 0
    buckets_done: int = 0
    work_s: float = 0.0  # the recapture's per-bucket capture times so far
    finished: Optional[RecaptureFinished] = None

    @property
    def wall_s(self) -> Optional[float]:
        return self.finished.seconds if self.finished is not None else None


class RecaptureTracker:
    """``current``: the recapture under way (None when none is); ``last``: the latest finished one."""

    def __init__(self) -> None:
        self.current: Optional[RecaptureRun] = None
        self.last: Optional[RecaptureRun] = None

    def requested(self, ev: RecaptureRequested, costs: Iterable[BucketCost]) -> None:
        lists = {
            phase: tuple(buckets)
            for phase, buckets in (("decode", ev.decode_bs), ("prefill", ev.prefill_num_tokens))
            if buckets is not None
        }
        self.current = RecaptureRun(lists, estimate_capture_seconds(costs, lists))

    def capture_started(self, ev: CaptureStarted) -> None:
        run = self.current
        if run is not None and ev.reason == "recapture":
            run.started = True
            run.buckets_total += len(ev.buckets)

    def capture_progress(self, ev: CaptureProgress) -> None:
        run = self.current
        if run is not None and run.started:
            run.buckets_done += 1
            run.work_s += ev.seconds

    def finished(self, ev: RecaptureFinished) -> None:
        run = self.current or RecaptureRun({})  # a trace or an attach may begin mid-recapture
        run.finished = ev
        self.current, self.last = None, run
