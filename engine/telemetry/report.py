"""Turns an event stream into the numbers that say whether CUDA graphs are paying off.

One ``summarize`` serves both the end-of-run summary of ``--record`` (fed the events as they were
published, via ``SummaryBuilder``) and ``graphtop trace summary`` (fed a ``Trace`` read from disk),
so the two can never disagree.

Definitions (also printed by ``format_summary``):

* graph hit rate = steps with ``path == "graph"`` / all steps (overall and per phase);
* bucket hits count graph steps only, keyed by phase then bucket (decode buckets are batch sizes,
  prefill buckets are token counts, so they are never mixed);
* padding waste overall = padded tokens / bucket tokens, over graph steps with a bucket;
* fallbacks = eager steps grouped by ``fallback_reason`` (None is shown as "(unspecified)");
* percentiles use linear interpolation between closest ranks (numpy's default);
* wall time spans the first to the last event (header excluded); throughput uses the serving window
  (first ``request_queued`` to last ``request_finished``) when there is one, so model loading and
  graph capture do not dilute tokens/s.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Optional, Union

from .events import (
    CaptureFinished,
    CaptureProgress,
    CaptureStarted,
    ConfigDowngrade,
    EngineStarted,
    ErrorEvent,
    Event,
    KVPoolState,
    MemoryLedger,
    RecaptureFinished,
    RequestFinished,
    RequestFirstToken,
    RequestQueued,
    StepEvent,
    TraceHeader,
)
from .trace import Trace

__all__ = [
    "BucketStats",
    "CaptureRecord",
    "Percentiles",
    "PhaseStats",
    "SummaryBuilder",
    "TraceSummary",
    "format_summary",
    "percentile",
    "summarize",
]

UNSPECIFIED = "(unspecified)"


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile (``q`` in 0..100) of an already sorted, non-empty list."""
    if not sorted_values:
        raise ValueError("percentile of empty list")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclass(frozen=True)
class Percentiles:
    """Distribution of a timing; all None when there were no samples."""

    count: int = 0
    p50: Optional[float] = None
    p90: Optional[float] = None
    p99: Optional[float] = None
    mean: Optional[float] = None
    max: Optional[float] = None

    @classmethod
    def of(cls, values: Iterable[float]) -> "Percentiles":
        vals = sorted(v for v in values if v is not None and math.isfinite(v))
        if not vals:
            return cls()
        return cls(
            count=len(vals),
            p50=percentile(vals, 50),
            p90=percentile(vals, 90),
            p99=percentile(vals, 99),
            mean=sum(vals) / len(vals),
            max=vals[-1],
        )


@dataclass
class BucketStats:
    """Graph steps that replayed one bucket."""

    bucket: int
    count: int = 0
    padded_tokens: int = 0
    waste_sum: float = 0.0  # sum of per-step padding_waste, for the mean

    @property
    def mean_waste(self) -> float:
        return self.waste_sum / self.count if self.count else 0.0


@dataclass
class PhaseStats:
    """Steps of one phase (decode | prefill | mixed)."""

    phase: str
    steps: int = 0
    graph_steps: int = 0
    tokens: int = 0
    padded_tokens: int = 0  # graph steps only
    bucket_tokens: int = 0  # sum of bucket sizes, graph steps only
    buckets: dict[int, BucketStats] = field(default_factory=dict)
    replay_ms: Percentiles = field(default_factory=Percentiles)
    host_ms: Percentiles = field(default_factory=Percentiles)

    @property
    def eager_steps(self) -> int:
        return self.steps - self.graph_steps

    @property
    def hit_rate(self) -> float:
        return self.graph_steps / self.steps if self.steps else 0.0

    @property
    def padding_waste(self) -> float:
        return self.padded_tokens / self.bucket_tokens if self.bucket_tokens else 0.0


@dataclass
class CaptureRecord:
    """One capture pass (initial or recapture) of one phase."""

    phase: str
    reason: str = "initial"
    backend: str = ""
    planned: tuple[int, ...] = ()
    captured: list[int] = field(default_factory=list)
    failed: dict[int, Optional[str]] = field(default_factory=dict)  # bucket -> failure reason
    seconds: float = 0.0
    memory_bytes: int = 0
    finished: bool = False  # a capture_finished event closed it (False: run ended mid-capture)
    ok: Optional[bool] = None
    failure_reason: Optional[str] = None


@dataclass
class TraceSummary:
    """Everything ``format_summary`` prints, as numbers (tests and the TUI use these directly)."""

    path: Optional[str] = None
    schema_version: Optional[int] = None
    meta: dict = field(default_factory=dict)
    engine: Optional[EngineStarted] = None
    emulated: bool = False
    truncated_tail: bool = False
    events: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    serving_s: float = 0.0
    # requests
    requests_queued: int = 0
    requests_finished: int = 0
    finish_reasons: dict[str, int] = field(default_factory=dict)
    request_errors: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    tokens_per_s: float = 0.0
    ttft_ms: Percentiles = field(default_factory=Percentiles)
    latency_ms: Percentiles = field(default_factory=Percentiles)
    # steps
    steps: int = 0
    graph_steps: int = 0
    phases: dict[str, PhaseStats] = field(default_factory=dict)
    fallbacks: list[tuple[str, int]] = field(default_factory=list)  # most frequent first
    padded_tokens: int = 0
    bucket_tokens: int = 0
    replay_ms: Percentiles = field(default_factory=Percentiles)
    host_ms: Percentiles = field(default_factory=Percentiles)
    missing_steps: int = 0  # gaps in step numbers: events the recorder dropped, most likely
    # capture / memory
    captures: list[CaptureRecord] = field(default_factory=list)
    memory: Optional[MemoryLedger] = None  # the last ledger seen
    kv_capacity_tokens: int = 0
    kv_peak_used_tokens: int = 0
    recaptures: int = 0
    recapture_failures: int = 0
    downgrades: list[ConfigDowngrade] = field(default_factory=list)
    errors: list[ErrorEvent] = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        return self.graph_steps / self.steps if self.steps else 0.0

    @property
    def padding_waste(self) -> float:
        return self.padded_tokens / self.bucket_tokens if self.bucket_tokens else 0.0


class SummaryBuilder:
    """Accumulates a ``TraceSummary`` one event at a time (usable live, from a bus subscriber)."""

    def __init__(self, header: Optional[TraceHeader] = None, path: Optional[str] = None) -> None:
        self._s = TraceSummary(path=path)
        if header is not None:
            self._s.schema_version = header.schema_version
            self._s.meta = dict(header.meta)
        self._counts: Counter[str] = Counter()
        self._first_ts: Optional[float] = None
        self._last_ts: Optional[float] = None
        self._first_queued: Optional[float] = None
        self._last_finished: Optional[float] = None
        self._reasons: Counter[str] = Counter()
        self._fallbacks: Counter[str] = Counter()
        self._ttft: list[float] = []
        self._latency: list[float] = []
        self._replay: dict[str, list[float]] = {}
        self._host: dict[str, list[float]] = {}
        self._step_numbers: set[int] = set()
        self._open_capture: dict[str, CaptureRecord] = {}

    def add(self, event: Event) -> None:
        s = self._s
        if isinstance(event, TraceHeader):
            s.schema_version = event.schema_version
            s.meta = dict(event.meta)
            return
        self._counts[event.type] += 1
        if self._first_ts is None or event.ts < self._first_ts:
            self._first_ts = event.ts
        if self._last_ts is None or event.ts > self._last_ts:
            self._last_ts = event.ts
        if isinstance(event, StepEvent):
            self._add_step(event)
        elif isinstance(event, RequestQueued):
            s.requests_queued += 1
            s.prompt_tokens += event.prompt_tokens
            if self._first_queued is None or event.ts < self._first_queued:
                self._first_queued = event.ts
        elif isinstance(event, RequestFirstToken):
            self._ttft.append(event.ttft_ms)
        elif isinstance(event, RequestFinished):
            s.requests_finished += 1
            s.output_tokens += event.output_tokens
            self._reasons[event.finish_reason or UNSPECIFIED] += 1
            if event.error is not None:
                s.request_errors += 1
            self._latency.append(event.latency_ms)
            if self._last_finished is None or event.ts > self._last_finished:
                self._last_finished = event.ts
        elif isinstance(event, KVPoolState):
            s.kv_capacity_tokens = event.capacity_tokens
            s.kv_peak_used_tokens = max(s.kv_peak_used_tokens, event.used_tokens)
        elif isinstance(event, (CaptureStarted, CaptureProgress, CaptureFinished)):
            self._add_capture(event)
        elif isinstance(event, MemoryLedger):
            s.memory = event
        elif isinstance(event, EngineStarted):
            s.engine = event
            s.emulated = s.emulated or event.emulated
        elif isinstance(event, RecaptureFinished):
            s.recaptures += 1
            if not event.ok:
                s.recapture_failures += 1
        elif isinstance(event, ConfigDowngrade):
            s.downgrades.append(event)
        elif isinstance(event, ErrorEvent):
            s.errors.append(event)

    def _add_step(self, ev: StepEvent) -> None:
        s = self._s
        s.steps += 1
        s.emulated = s.emulated or ev.emulated
        self._step_numbers.add(ev.step)
        ph = s.phases.get(ev.phase)
        if ph is None:
            ph = s.phases[ev.phase] = PhaseStats(ev.phase)
        ph.steps += 1
        ph.tokens += ev.num_tokens
        self._host.setdefault(ev.phase, []).append(ev.host_ms)
        if ev.path == "graph":
            s.graph_steps += 1
            ph.graph_steps += 1
            if ev.replay_ms is not None:
                self._replay.setdefault(ev.phase, []).append(ev.replay_ms)
            if ev.bucket is not None:
                b = ph.buckets.get(ev.bucket)
                if b is None:
                    b = ph.buckets[ev.bucket] = BucketStats(ev.bucket)
                b.count += 1
                b.padded_tokens += ev.padded
                b.waste_sum += ev.padding_waste
                ph.padded_tokens += ev.padded
                ph.bucket_tokens += ev.bucket
        else:
            self._fallbacks[ev.fallback_reason or UNSPECIFIED] += 1

    def _add_capture(self, ev: Union[CaptureStarted, CaptureProgress, CaptureFinished]) -> None:
        rec = self._open_capture.get(ev.phase)
        if isinstance(ev, CaptureStarted) or rec is None:
            reason = ev.reason if isinstance(ev, CaptureStarted) else "unknown"
            rec = CaptureRecord(phase=ev.phase, reason=reason)
            self._s.captures.append(rec)
            self._open_capture[ev.phase] = rec
        if isinstance(ev, CaptureStarted):
            rec.backend = ev.backend
            rec.planned = ev.buckets
        elif isinstance(ev, CaptureProgress):
            if ev.ok:
                rec.captured.append(ev.bucket)
            else:
                rec.failed[ev.bucket] = ev.failure_reason
            rec.seconds += ev.seconds
            rec.memory_bytes += ev.memory_bytes
        else:  # CaptureFinished is authoritative for totals
            rec.captured = list(ev.captured)
            rec.failed = {b: rec.failed.get(b) for b in ev.failed}
            rec.seconds = ev.seconds
            rec.memory_bytes = ev.memory_bytes
            rec.ok = ev.ok
            rec.failure_reason = ev.failure_reason
            rec.finished = True
            del self._open_capture[ev.phase]

    def build(self, truncated_tail: bool = False) -> TraceSummary:
        """Freeze the derived numbers (percentiles, rankings, totals) into the summary."""
        s = self._s
        s.truncated_tail = truncated_tail
        s.counts = dict(self._counts)
        s.events = sum(self._counts.values())
        if self._first_ts is not None and self._last_ts is not None:
            s.wall_s = self._last_ts - self._first_ts
        if self._first_queued is not None and self._last_finished is not None:
            s.serving_s = max(0.0, self._last_finished - self._first_queued)
        window = s.serving_s or s.wall_s
        s.tokens_per_s = s.output_tokens / window if window > 0 else 0.0
        s.finish_reasons = dict(self._reasons.most_common())
        s.fallbacks = sorted(self._fallbacks.items(), key=lambda kv: (-kv[1], kv[0]))
        s.ttft_ms = Percentiles.of(self._ttft)
        s.latency_ms = Percentiles.of(self._latency)
        for phase, ph in s.phases.items():
            ph.replay_ms = Percentiles.of(self._replay.get(phase, []))
            ph.host_ms = Percentiles.of(self._host.get(phase, []))
            ph.buckets = dict(sorted(ph.buckets.items()))
        s.replay_ms = Percentiles.of(v for vals in self._replay.values() for v in vals)
        s.host_ms = Percentiles.of(v for vals in self._host.values() for v in vals)
        s.padded_tokens = sum(ph.padded_tokens for ph in s.phases.values())
        s.bucket_tokens = sum(ph.bucket_tokens for ph in s.phases.values())
        if self._step_numbers:
            lo, hi = min(self._step_numbers), max(self._step_numbers)
            s.missing_steps = (hi - lo + 1) - len(self._step_numbers)
        return s


def summarize(
    trace: Union[Trace, Iterable[Event]], *, header: Optional[TraceHeader] = None
) -> TraceSummary:
    """Summarize a ``Trace`` (from ``read_trace``) or any iterable of events."""
    if isinstance(trace, Trace):
        builder = SummaryBuilder(trace.header, trace.path)
        for ev in trace.events:
            builder.add(ev)
        return builder.build(truncated_tail=trace.truncated_tail)
    builder = SummaryBuilder(header)
    for ev in trace:
        builder.add(ev)
    return builder.build()


# -- text report ----------------------------------------------------------------------------------


def _bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # unreachable


def _ms(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.3f}"


def _pct(x: float) -> str:
    return f"{100.0 * x:.1f}%"


def _bar(value: int, peak: int, width: int, ascii_only: bool) -> str:
    if peak <= 0 or width <= 0:
        return ""
    n = round(width * value / peak)
    if value > 0:
        n = max(n, 1)
    return ("#" if ascii_only else "\u2588") * n


def _percentile_row(label: str, p: Percentiles) -> str:
    return (
        f"  {label:<24}{p.count:>8}  {_ms(p.p50):>9}  {_ms(p.p90):>9}  {_ms(p.p99):>9}  {_ms(p.max):>9}"
    )


def format_summary(summary: TraceSummary, *, width: int = 30, ascii_only: bool = False) -> str:
    """Human-readable report (plain text, no colour) for the terminal or a log."""
    s = summary
    out: list[str] = []
    title = "graphtop trace summary" + (f": {s.path}" if s.path else "")
    out.append(title)
    if s.engine is not None:
        e = s.engine
        out.append(
            f"  model {e.model or '?'} ({e.architecture or '?'}) on {e.device_name or e.device or '?'}"
            f" dtype {e.dtype or '?'}, attention {e.attention_backend or '?'},"
            f" graphs decode={e.decode_graph_backend or '-'} prefill={e.prefill_graph_backend or '-'}"
        )
    if s.emulated:
        out.append("  EMULATED run: graph replays were emulated, timings are not real CUDA-graph timings")
    if s.truncated_tail:
        out.append("  note: the last trace line was incomplete and skipped (writer killed?)")
    if s.missing_steps:
        out.append(f"  note: step numbers missing from the trace: {s.missing_steps} (events dropped?)")
    out.append(f"  {s.events} events over {s.wall_s:.2f} s")

    out.append("")
    out.append("Requests")
    reasons = ", ".join(f"{k} {v}" for k, v in s.finish_reasons.items())
    out.append(
        f"  queued {s.requests_queued}  finished {s.requests_finished}"
        + (f" ({reasons})" if reasons else "")
        + (f"  errors {s.request_errors}" if s.request_errors else "")
    )
    out.append(f"  prompt tokens {s.prompt_tokens}  output tokens {s.output_tokens}")
    window = f"serving {s.serving_s:.2f} s" if s.serving_s else f"wall {s.wall_s:.2f} s"
    out.append(f"  throughput {s.tokens_per_s:.1f} output tok/s ({window})")

    out.append("")
    out.append("Steps")
    out.append(f"  {'phase':<10}{'steps':>8}{'graph':>8}{'eager':>8}{'hit rate':>10}{'waste':>9}")
    for ph in s.phases.values():
        out.append(
            f"  {ph.phase:<10}{ph.steps:>8}{ph.graph_steps:>8}{ph.eager_steps:>8}"
            f"{_pct(ph.hit_rate):>10}{_pct(ph.padding_waste):>9}"
        )
    out.append(
        f"  {'total':<10}{s.steps:>8}{s.graph_steps:>8}{s.steps - s.graph_steps:>8}"
        f"{_pct(s.hit_rate):>10}{_pct(s.padding_waste):>9}"
    )
    out.append(
        f"  padding waste overall {_pct(s.padding_waste)}"
        f" ({s.padded_tokens} padded of {s.bucket_tokens} bucket tokens, graph steps)"
    )

    if any(ph.buckets for ph in s.phases.values()):
        out.append("")
        out.append("Bucket hits (graph steps)")
        for ph in s.phases.values():
            if not ph.buckets:
                continue
            peak = max(b.count for b in ph.buckets.values())
            for b in ph.buckets.values():
                out.append(
                    f"  {ph.phase:<8}{b.bucket:>7} {_bar(b.count, peak, width, ascii_only):<{width}}"
                    f" {b.count:>7}  padded {b.padded_tokens:>7}  mean waste {_pct(b.mean_waste):>6}"
                )

    if s.fallbacks:
        out.append("")
        out.append("Fallbacks (eager steps by reason)")
        total = sum(c for _, c in s.fallbacks)
        for i, (reason, count) in enumerate(s.fallbacks, 1):
            out.append(f"  {i:>2}. {reason:<32}{count:>8}  {_pct(count / total):>6}")

    out.append("")
    out.append(f"Timing (ms){'':<14}{'count':>9}  {'p50':>9}  {'p90':>9}  {'p99':>9}  {'max':>9}")
    out.append(_percentile_row("replay (graph steps)", s.replay_ms))
    for ph in s.phases.values():
        if ph.replay_ms.count and len(s.phases) > 1:
            out.append(_percentile_row(f"  replay {ph.phase}", ph.replay_ms))
    out.append(_percentile_row("host (all steps)", s.host_ms))
    for ph in s.phases.values():
        if ph.host_ms.count and len(s.phases) > 1:
            out.append(_percentile_row(f"  host {ph.phase}", ph.host_ms))
    if s.ttft_ms.count:
        out.append(_percentile_row("TTFT", s.ttft_ms))
    if s.latency_ms.count:
        out.append(_percentile_row("request latency", s.latency_ms))

    if s.captures:
        out.append("")
        out.append("Capture ledger")
        for c in s.captures:
            state = "" if c.finished else "  (unfinished)"
            if c.finished and c.ok is False:
                state = f"  FAILED: {c.failure_reason or 'unknown'}"
            planned = f"/{len(c.planned)}" if c.planned else ""
            out.append(
                f"  {c.phase:<8}{c.reason:<10} captured {len(c.captured)}{planned}"
                f"  failed {len(c.failed)}  {c.seconds:.2f} s  {_bytes(c.memory_bytes)}"
                + (f"  [{c.backend}]" if c.backend else "")
                + state
            )
            for bucket, why in c.failed.items():
                out.append(f"      bucket {bucket}: {why or 'no reason given'}")
    if s.recaptures:
        out.append(f"  recaptures {s.recaptures} ({s.recapture_failures} failed)")

    if s.memory is not None:
        m = s.memory
        out.append("")
        out.append(f"Memory ledger ({m.device or 'device'})")
        for label, value in (
            ("total", m.total),
            ("weights", m.weights),
            ("kv pool", m.kv_pool),
            ("decode graphs", m.decode_graphs),
            ("prefill graphs", m.prefill_graphs),
            ("activation reserve", m.activation_reserve),
            ("free", m.free),
        ):
            out.append(f"  {label:<20}{_bytes(value):>12}")
    if s.kv_capacity_tokens:
        out.append(
            f"  KV pool peak {s.kv_peak_used_tokens}/{s.kv_capacity_tokens} tokens"
            f" ({_pct(s.kv_peak_used_tokens / s.kv_capacity_tokens)})"
        )

    if s.downgrades:
        out.append("")
        out.append("Config downgrades")
        for d in s.downgrades:
            out.append(f"  {d.key}: {d.old!r} -> {d.new!r} ({d.reason})")
    if s.errors:
        out.append("")
        out.append(f"Errors ({len(s.errors)})")
        for err in s.errors[:10]:
            out.append(f"  {'FATAL ' if err.fatal else ''}{err.where}: {err.message}")
        if len(s.errors) > 10:
            out.append(f"  ... {len(s.errors) - 10} more")
    return "\n".join(out) + "\n"
