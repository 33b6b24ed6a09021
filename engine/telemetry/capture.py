"""What a capture cost, bucket by bucket and pass by pass: one record for the engine and its readers.

The engine's capture job keeps a ``BucketCost`` per bucket and publishes it as ``capture_progress``;
the trace report, the dashboard and the what-if read those events back into the same type, so a cost
means the same thing everywhere. A ``CapturePass`` is one initial capture or recapture of one phase,
folded from ``capture_started`` / ``capture_progress`` / ``capture_finished`` (the last one is
authoritative for the totals).
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional, Union

from .events import CaptureFinished, CaptureProgress, CaptureStarted

__all__ = ["BucketCost", "CaptureEvent", "CapturePass", "CaptureTracker", "cost_points", "estimate_cost"]

CaptureEvent = Union[CaptureStarted, CaptureProgress, CaptureFinished]


@dataclass(frozen=True)
class BucketCost:
    """Capturing one bucket: wall time and device memory it took, or why it failed."""

    phase: str
    bucket: int
    seconds: float
    memory_bytes: int
    ok: bool = True
    failure_reason: Optional[str] = None

    @classmethod
    def of(cls, ev: CaptureProgress) -> "BucketCost":
        return cls(ev.phase, ev.bucket, ev.seconds, ev.memory_bytes, ev.ok, ev.failure_reason)


def cost_points(costs: Iterable[BucketCost], phase: str, what: str = "memory_bytes") -> dict[int, float]:
    """Bucket -> measured ``what`` (``memory_bytes`` or ``seconds``) of the buckets of ``phase`` that
    captured; failed captures are no basis for an estimate."""
    return {c.bucket: float(getattr(c, what)) for c in costs if c.phase == phase and c.ok}


def estimate_cost(points: Mapping[int, float], bucket: int) -> Optional[float]:
    """Per-bucket cost at ``bucket`` from measured ``points`` (bucket -> value).

    Exact where measured; linear between neighbours; outside the measured range, the slope of the
    nearest two points (clamped at >= 0); a single point is used as a constant. None without data.
    """
    if not points:
        return None
    if bucket in points:
        return float(points[bucket])
    xs = sorted(points)
    if len(xs) == 1:
        return float(points[xs[0]])
    i = bisect.bisect_left(xs, bucket)
    if i == 0:
        x0, x1 = xs[0], xs[1]
    elif i == len(xs):
        x0, x1 = xs[-2], xs[-1]
    else:
        x0, x1 = xs[i - 1], xs[i]
    y0, y1 = float(points[x0]), float(points[x1])
    value = y0 + (y1 - y0) * (bucket - x0) / (x1 - x0)
    return max(value, 0.0)


@dataclass
class CapturePass:
    """One capture pass (initial or recapture) of one phase, on one tensor-parallel rank."""

    phase: str
    reason: str = "initial"
    backend: str = ""
    planned: tuple[int, ...] = ()
    costs: list[BucketCost] = field(default_factory=list)  # in capture order (CUDA: largest bucket first)
    finished: Optional[CaptureFinished] = None  # None: still capturing, or the run ended mid-capture
    rank: int = 0

    @property
    def total(self) -> int:
        return len(self.planned)

    @property
    def captured(self) -> list[int]:
        if self.finished is not None:
            return list(self.finished.captured)
        return [c.bucket for c in self.costs if c.ok]

    @property
    def failed(self) -> dict[int, Optional[str]]:
        """Failed bucket -> reason (None when no reason was given)."""
        reasons = {c.bucket: c.failure_reason for c in self.costs if not c.ok}
        if self.finished is not None:
            return {b: reasons.get(b) for b in self.finished.failed}
        return reasons

    @property
    def seconds(self) -> float:
        return self.finished.seconds if self.finished is not None else sum(c.seconds for c in self.costs)

    @property
    def memory_bytes(self) -> int:
        return self.finished.memory_bytes if self.finished is not None else sum(c.memory_bytes for c in self.costs)

    @property
    def ok(self) -> Optional[bool]:
        return self.finished.ok if self.finished is not None else None

    @property
    def failure_reason(self) -> Optional[str]:
        return self.finished.failure_reason if self.finished is not None else None


class CaptureTracker:
    """Folds capture events into passes.

    ``latest`` is each phase's most recent pass and ``passes`` keeps the last ``history`` passes of all
    phases (all of them when None), both of rank 0 (the engine's own process); ``ranks`` has every
    rank's latest pass per phase (tensor-parallel workers capture the same buckets in their own pools).
    A progress event with no pass open (a trace that starts mid-capture) opens one whose reason is
    "unknown".
    """

    def __init__(self, history: Optional[int] = None) -> None:
        self.passes: deque[CapturePass] = deque(maxlen=history)
        self.latest: dict[str, CapturePass] = {}
        self.ranks: dict[int, dict[str, CapturePass]] = {}
        self._open: dict[tuple[int, str], CapturePass] = {}

    def apply(self, ev: CaptureEvent) -> CapturePass:
        key = (ev.rank, ev.phase)
        cap = self._open.get(key)
        if isinstance(ev, CaptureStarted) or cap is None:
            if isinstance(ev, CaptureStarted):
                cap = CapturePass(ev.phase, ev.reason, ev.backend, tuple(ev.buckets), rank=ev.rank)
            else:
                cap = CapturePass(ev.phase, "unknown", rank=ev.rank)
            self._open[key] = cap
            self.ranks.setdefault(ev.rank, {})[ev.phase] = cap
            if ev.rank == 0:
                self.latest[ev.phase] = cap
                self.passes.append(cap)
        if isinstance(ev, CaptureProgress):
            cap.costs.append(BucketCost.of(ev))
        elif isinstance(ev, CaptureFinished):
            cap.finished = ev
            del self._open[key]
        return cap
