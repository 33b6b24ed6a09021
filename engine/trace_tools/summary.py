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

from dataclasses import dataclass, field
from typing import Iterable, Optional, Union

from ..telemetry.capture import CapturePass
from ..telemetry.events import ConfigDowngrade, EngineStarted, ErrorEvent, Event, MemoryLedger, TraceHeader
from ..telemetry.fold import FoldLimits, RunFold
from ..telemetry.fold_steps import PhaseTally
from .stats import HitTally, ParityTally, Percentiles
from .trace import Trace

__all__ = ["PhaseStats", "RankSummary", "SummaryBuilder", "TraceSummary", "UNSPECIFIED", "summarize"]

UNSPECIFIED = "(unspecified)"


@dataclass
class PhaseStats(PhaseTally):
    """Steps of one phase (decode | prefill | mixed), with their timings' distributions."""

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
    """Accumulates a ``TraceSummary`` one event at a time (usable live, from a bus subscriber): a view
    over a ``RunFold`` that remembers everything (percentiles are over the whole run)."""

    def __init__(self, header: Optional[TraceHeader] = None, path: Optional[str] = None) -> None:
        self._header = header
        self._path = path
        self.fold = RunFold(FoldLimits.everything())

    def add(self, event: Event) -> None:
        self.fold.apply(event)

    def build(self, truncated_tail: bool = False) -> TraceSummary:
        """Read the summary's numbers (percentiles, rankings, totals) off the fold."""
        f = self.fold
        header = f.header if f.header is not None else self._header
        s = TraceSummary(path=self._path, truncated_tail=truncated_tail)
        hits = f.steps.hits
        s.steps, s.graph_steps, s.padded_tokens, s.bucket_tokens = (
            hits.steps,
            hits.graph_steps,
            hits.padded_tokens,
            hits.bucket_tokens,
        )
        if header is not None:
            s.schema_version, s.meta = header.schema_version, dict(header.meta)
        s.engine, s.emulated = f.info, f.emulated
        s.counts = {kind: n for kind, n in f.counts.items() if kind != "header"}
        s.events = sum(s.counts.values())
        if f.first_ts is not None and f.last_ts is not None:
            s.wall_s = f.last_ts - f.first_ts
        self._requests(s)
        for phase, tally in f.steps.phases.items():
            s.phases[phase] = PhaseStats(
                **{**vars(tally), "buckets": dict(sorted(tally.buckets.items()))},
                replay_ms=Percentiles.of(f.steps.replay_by_phase.values(phase)),
                host_ms=Percentiles.of(f.steps.host_by_phase.values(phase)),
            )
        fallbacks = f.steps.fallback_reasons(UNSPECIFIED)
        s.fallbacks = sorted(fallbacks.items(), key=lambda kv: (-kv[1], kv[0]))
        s.replay_ms = Percentiles.of(f.steps.replay_ms.values)
        s.host_ms = Percentiles.of(f.steps.host_by_phase.all_values())
        s.missing_steps = f.steps.missing
        s.captures = list(f.captures.passes)
        s.memory = f.ledger
        s.kv_capacity_tokens = f.kv.capacity_tokens if f.kv is not None else 0
        s.kv_peak_used_tokens = f.kv_peak_used
        s.recaptures = sum(f.recapture_results.values())
        s.recapture_failures = f.recapture_results["failed"]
        s.downgrades = list(f.downgrades)
        s.errors = f.all_errors()
        s.parity = f.parity
        self._ranks(s)
        return s

    def _requests(self, s: TraceSummary) -> None:
        r = self.fold.requests
        s.requests_queued, s.requests_finished, s.request_errors = r.queued, r.finished, r.errors
        s.prompt_tokens, s.output_tokens = r.prompt_tokens, r.output_tokens
        if r.first_queued_ts is not None and r.last_finished_ts is not None:
            s.serving_s = max(0.0, r.last_finished_ts - r.first_queued_ts)
        window = s.serving_s or s.wall_s
        s.tokens_per_s = s.output_tokens / window if window > 0 else 0.0
        s.finish_reasons = dict(r.reasons_or(UNSPECIFIED).most_common())
        s.ttft_ms = Percentiles.of(r.ttft_ms.values)
        s.latency_ms = Percentiles.of(r.latency_ms.values)

    def _ranks(self, s: TraceSummary) -> None:
        """Tensor parallel: every rank's captures, memory and replay times (rank 0's are its steps')."""
        f = self.fold
        captures, replay = f.captures.ranks, f.rank_replay.by_key
        if len(captures) <= 1 and len(f.ledgers) <= 1 and not replay:
            return
        times = {rank: list(samples.values) for rank, samples in replay.items()}
        times[0] = list(f.steps.replay_ms.values)
        for rank in sorted(set(captures) | set(f.ledgers) | set(times)):
            s.ranks[rank] = RankSummary(
                rank, dict(captures.get(rank, {})), f.ledgers.get(rank), Percentiles.of(times.get(rank, []))
            )


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
