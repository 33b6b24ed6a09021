"""The numbers behind ``graphtop trace report``'s charts, folded from a trace.

Nothing is counted twice in two ways: the totals (bucket hits and padding, fallback reasons, capture
passes, percentiles) come from ``trace_tools.summary``, what ``graphtop trace summary`` and the
end-of-run summary print, and the per-request samples the distributions are drawn from (TTFT, queue
time, inter-token latency) from the fold that summary reads (``telemetry.fold``, the fold of
``/metrics`` too); the advice from ``advise.compute_advice``, what ``graphtop advise`` prints. What only
a picture needs is collected here in one pass: values over time (step and host time, KV use).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from graphtop.engine.telemetry.events import KVPoolState, StepEvent
from graphtop.engine.trace_tools.summary import SummaryBuilder, TraceSummary
from graphtop.engine.trace_tools.trace import Trace

MAX_POINTS = 1500
"""Points a line keeps: a longer run is averaged into this many bins (its peak kept beside the mean)."""


@dataclass
class Timeline:
    """Values over the run: x in seconds since the trace's first event."""

    points: list[tuple[float, float]] = field(default_factory=list)

    def add(self, x: float, y: Optional[float]) -> None:
        if y is not None and math.isfinite(y) and math.isfinite(x):
            self.points.append((x, y))

    def binned(self, bins: int = MAX_POINTS) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
        """(mean, max) per bin of consecutive points: the line as it is when it has at most ``bins``."""
        pts = self.points
        if len(pts) <= bins:
            return list(pts), []
        size = len(pts) / bins
        mean, peak = [], []
        for b in range(bins):
            chunk = pts[int(b * size) : int((b + 1) * size)] or pts[int(b * size) : int(b * size) + 1]
            x = chunk[len(chunk) // 2][0]
            ys = [y for _, y in chunk]
            mean.append((x, sum(ys) / len(ys)))
            peak.append((x, max(ys)))
        return mean, peak


@dataclass
class ReportData:
    """Everything the report draws."""

    path: str
    summary: TraceSummary
    step_ms: Timeline = field(default_factory=Timeline)
    host_ms: Timeline = field(default_factory=Timeline)
    kv_used: Timeline = field(default_factory=Timeline)
    kv_capacity: Timeline = field(default_factory=Timeline)
    ttft_ms: list[float] = field(default_factory=list)
    itl_ms: list[float] = field(default_factory=list)
    queue_ms: list[float] = field(default_factory=list)
    advice: Any = None  # advise.Advice, or None
    advice_note: str = ""  # why there is no advice


def step_time_ms(ev: StepEvent) -> float:
    """A step's time: on the device where it was measured (a graph's replay, an eager forward on
    CUDA), else the host's wall time of the step (a CPU run's eager steps)."""
    if ev.replay_ms is not None:
        return ev.replay_ms
    if ev.forward_ms is not None:
        return ev.forward_ms
    return ev.host_ms


def collect(trace: Trace) -> ReportData:
    """Fold ``trace`` into the report's numbers (see the module docstring for who counts what)."""
    from .advise import compute_advice

    builder = SummaryBuilder(trace.header, trace.path)
    step_ms, host_ms, kv_used, kv_capacity = Timeline(), Timeline(), Timeline(), Timeline()
    start = min((ev.ts for ev in trace.events), default=0.0)
    for ev in trace.events:
        builder.add(ev)
        t = ev.ts - start
        if isinstance(ev, StepEvent):
            step_ms.add(t, step_time_ms(ev))
            host_ms.add(t, ev.host_ms)
        elif isinstance(ev, KVPoolState):
            kv_used.add(t, float(ev.used_tokens))
            kv_capacity.add(t, float(ev.capacity_tokens))
    requests = builder.fold.requests
    data = ReportData(
        trace.path or "trace",
        builder.build(truncated_tail=trace.truncated_tail),
        step_ms,
        host_ms,
        kv_used,
        kv_capacity,
        ttft_ms=list(requests.ttft_ms.values),
        itl_ms=list(requests.itl_ms.values),
        queue_ms=list(requests.queue_ms.values),
    )
    try:
        data.advice = compute_advice(trace)
    except ValueError as exc:
        data.advice_note = str(exc)
    return data
