"""Turns an event stream into the numbers that say whether CUDA graphs are paying off.

One ``summarize`` serves both the end-of-run summary of ``--record`` (fed the events as they were
published, via ``SummaryBuilder``) and ``graphtop trace summary`` (fed a ``Trace`` read from disk),
so the two can never disagree. The counting rules live in ``stats`` (shared with the dashboard and
the what-if); ``report`` turns a ``TraceSummary`` into text.

Beyond ``stats``' definitions:

* bucket hits count graph steps only, keyed by phase then bucket (decode buckets are batch sizes,
  prefill buckets are token counts, so they are never mixed);
* fallbacks = eager steps grouped by ``fallback_reason`` (None is shown as "(unspecified)");
* wall time spans the first to the last event (header excluded); throughput uses the serving window
  (first ``request_queued`` to last ``request_finished``) when there is one, so model loading and
  graph capture do not dilute tokens/s.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Optional, Union

from ..telemetry.capture import CapturePass, CaptureTracker
from ..telemetry.events import (
    CaptureFinished,
    CaptureProgress,
    CaptureStarted,
    ConfigDowngrade,
    EngineStarted,
    ErrorEvent,
    Event,
    KVPoolState,
    MemoryLedger,
    ParityCheck,
    ParityNotRun,
    RankReplay,
    RecaptureFinished,
    RequestFinished,
    RequestFirstToken,
    RequestQueued,
    StepEvent,
    TraceHeader,
)
from .stats import BucketTally, HitTally, ParityTally, Percentiles
from .trace import Trace

__all__ = ["PhaseStats", "RankSummary", "SummaryBuilder", "TraceSummary", "UNSPECIFIED", "summarize"]

UNSPECIFIED = "(unspecified)"


@dataclass
class PhaseStats(HitTally):
    """Steps of one phase (decode | prefill | mixed)."""

    phase: str = field(default="", kw_only=True)
    tokens: int = 0
    buckets: dict[int, BucketTally] = field(default_factory=dict)
    replay_ms: Percentiles = field(default_factory=Percentiles)
    host_ms: Percentiles = field(default_factory=Percentiles)


@dataclass
class RankSummary:
    """One tensor-parallel rank: its latest capture pass per phase, last ledger and replay times (rank
    0's replay times are its graph steps'; a worker's come in ``rank_replay`` events)."""

    rank: int
    captures: dict[str, CapturePass] = field(default_factory=dict)
    memory: Optional[MemoryLedger] = None
    replay_ms: Percentiles = field(default_factory=Percentiles)


@dataclass
class TraceSummary(HitTally):
    """Everything ``format_summary`` prints, as numbers (tests and tools use these directly).

    The inherited tally counts every step of every phase."""

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
    phases: dict[str, PhaseStats] = field(default_factory=dict)
    fallbacks: list[tuple[str, int]] = field(default_factory=list)  # most frequent first
    replay_ms: Percentiles = field(default_factory=Percentiles)
    host_ms: Percentiles = field(default_factory=Percentiles)
    missing_steps: int = 0  # gaps in step numbers: events the recorder dropped, most likely
    # capture / memory
    captures: list[CapturePass] = field(default_factory=list)
    memory: Optional[MemoryLedger] = None  # the last ledger seen
    kv_capacity_tokens: int = 0
    kv_peak_used_tokens: int = 0
    recaptures: int = 0
    recapture_failures: int = 0
    downgrades: list[ConfigDowngrade] = field(default_factory=list)
    errors: list[ErrorEvent] = field(default_factory=list)
    parity: ParityTally = field(default_factory=ParityTally)  # graph-vs-eager checks (--parity-every)
    ranks: dict[int, RankSummary] = field(default_factory=dict)  # tensor parallel: every rank; else empty


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
        self._captures = CaptureTracker()
        self._rank_memory: dict[int, MemoryLedger] = {}
        self._rank_replay: dict[int, list[float]] = {}

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
            self._captures.apply(event)
        elif isinstance(event, MemoryLedger):
            self._rank_memory[event.rank] = event
            if event.rank == 0:
                s.memory = event
        elif isinstance(event, RankReplay):
            self._rank_replay.setdefault(event.rank, []).extend(event.replay_ms)
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
        elif isinstance(event, ParityCheck):
            s.parity.add(event)
        elif isinstance(event, ParityNotRun):
            s.parity.not_run(event)

    def _add_step(self, ev: StepEvent) -> None:
        s = self._s
        graph = ev.path == "graph"
        s.add(graph, ev.bucket, ev.padded)
        s.emulated = s.emulated or ev.emulated
        self._step_numbers.add(ev.step)
        ph = s.phases.get(ev.phase)
        if ph is None:
            ph = s.phases[ev.phase] = PhaseStats(phase=ev.phase)
        ph.add(graph, ev.bucket, ev.padded)
        ph.tokens += ev.num_tokens
        self._host.setdefault(ev.phase, []).append(ev.host_ms)
        if graph:
            if ev.replay_ms is not None:
                self._replay.setdefault(ev.phase, []).append(ev.replay_ms)
            if ev.bucket is not None:
                b = ph.buckets.get(ev.bucket)
                if b is None:
                    b = ph.buckets[ev.bucket] = BucketTally(ev.bucket)
                b.add(ev.padded, ev.padding_waste)
        else:
            self._fallbacks[ev.fallback_reason or UNSPECIFIED] += 1

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
        s.captures = list(self._captures.passes)
        s.ttft_ms = Percentiles.of(self._ttft)
        s.latency_ms = Percentiles.of(self._latency)
        for phase, ph in s.phases.items():
            ph.replay_ms = Percentiles.of(self._replay.get(phase, []))
            ph.host_ms = Percentiles.of(self._host.get(phase, []))
            ph.buckets = dict(sorted(ph.buckets.items()))
        s.replay_ms = Percentiles.of(v for vals in self._replay.values() for v in vals)
        s.host_ms = Percentiles.of(v for vals in self._host.values() for v in vals)
        if len(self._captures.ranks) > 1 or len(self._rank_memory) > 1 or self._rank_replay:
            replay = {**self._rank_replay, 0: [v for vals in self._replay.values() for v in vals]}
            for rank in sorted(set(self._captures.ranks) | set(self._rank_memory) | set(replay)):
                s.ranks[rank] = RankSummary(
                    rank,
                    dict(self._captures.ranks.get(rank, {})),
                    self._rank_memory.get(rank),
                    Percentiles.of(replay.get(rank, [])),
                )
        if self._step_numbers:
            lo, hi = min(self._step_numbers), max(self._step_numbers)
            s.missing_steps = (hi - lo + 1) - len(self._step_numbers)
        return s


def summarize(trace: Union[Trace, Iterable[Event]], *, header: Optional[TraceHeader] = None) -> TraceSummary:
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
