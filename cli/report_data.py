"""The numbers behind ``graphtop trace report``'s charts, folded from a trace.

Nothing is counted twice in two ways: the totals (bucket hits and padding, fallback reasons, capture
passes, percentiles) come from ``telemetry.summary.summarize``, the fold ``graphtop trace summary`` and
the end-of-run summary print; the advice from ``advise.compute_advice``, what ``graphtop advise``
prints; a request's inter-token latency from ``stats.mean_itl_ms``, the rule of ``/metrics``. What only
a picture needs is collected here in one pass: values over time (step and host time, KV use) and the
per-request samples the distributions are drawn from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from graphtop.engine.telemetry.events import KVPoolState, RequestFinished, RequestFirstToken, StepEvent
from graphtop.engine.telemetry.latency import mean_itl_ms
from graphtop.engine.trace_tools.summary import TraceSummary, summarize
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

    data = ReportData(trace.path or "trace", summarize(trace))
    start = min((ev.ts for ev in trace.events), default=0.0)
    ttft: dict[str, float] = {}
    for ev in trace.events:
        t = ev.ts - start
        if isinstance(ev, StepEvent):
            data.step_ms.add(t, step_time_ms(ev))
            data.host_ms.add(t, ev.host_ms)
        elif isinstance(ev, KVPoolState):
            data.kv_used.add(t, float(ev.used_tokens))
            data.kv_capacity.add(t, float(ev.capacity_tokens))
        elif isinstance(ev, RequestFirstToken):
            ttft[ev.request_id] = ev.ttft_ms
            data.ttft_ms.append(ev.ttft_ms)
            if ev.queue_ms is not None:
                data.queue_ms.append(ev.queue_ms)
        elif isinstance(ev, RequestFinished) and ev.finish_reason != "rejected":
            itl = mean_itl_ms(ttft.pop(ev.request_id, None), ev.latency_ms, ev.output_tokens)
            if itl is not None:
                data.itl_ms.append(itl)
    try:
        data.advice = compute_advice(trace)
    except ValueError as exc:
        data.advice_note = str(exc)
    return data
