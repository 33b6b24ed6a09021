"""What a capture cost, bucket by bucket and pass by pass: one record for the engine and its readers.

The engine's capture job keeps a ``BucketCost`` per bucket and publishes it as ``capture_progress``;
the trace report, the dashboard and the what-if read those events back into the same type, so a cost
means the same thing everywhere. A ``CapturePass`` is one initial capture or recapture of one phase,
folded from ``capture_started`` / ``capture_progress`` / ``capture_finished`` (the last one is
authoritative for the totals).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Optional, Union

from .events import CaptureFinished, CaptureProgress, CaptureStarted

__all__ = ["BucketCost", "CaptureEvent", "CapturePass", "CaptureTracker"]

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


@dataclass
class CapturePass:
    """One capture pass (initial or recapture) of one phase."""

    phase: str
    reason: str = "initial"
    backend: str = ""
    planned: tuple[int, ...] = ()
    costs: list[BucketCost] = field(default_factory=list)  # in capture order (CUDA: largest bucket first)
    finished: Optional[CaptureFinished] = None  # None: still capturing, or the run ended mid-capture

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

    ``latest`` is each phase's most recent pass; ``passes`` keeps the last ``history`` passes of all
    phases (all of them when None). A progress event with no pass open (a trace that starts
    mid-capture) opens one whose reason is "unknown".
    """

    def __init__(self, history: Optional[int] = None) -> None:
        self.passes: deque[CapturePass] = deque(maxlen=history)
        self.latest: dict[str, CapturePass] = {}
        self._open: dict[str, CapturePass] = {}

    def apply(self, ev: CaptureEvent) -> CapturePass:
        cap = self._open.get(ev.phase)
        if isinstance(ev, CaptureStarted) or cap is None:
            if isinstance(ev, CaptureStarted):
                cap = CapturePass(ev.phase, ev.reason, ev.backend, tuple(ev.buckets))
            else:
                cap = CapturePass(ev.phase, "unknown")
            self._open[ev.phase] = self.latest[ev.phase] = cap
            self.passes.append(cap)
        if isinstance(ev, CaptureProgress):
            cap.costs.append(BucketCost.of(ev))
        elif isinstance(ev, CaptureFinished):
            cap.finished = ev
            del self._open[ev.phase]
        return cap
