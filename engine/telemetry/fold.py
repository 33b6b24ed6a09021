"""One fold of the event stream: every fact its readers share, derived once, dispatched in one place.

``RunFold.apply(event)`` is the only code that dispatches on an event's type. The readers are views
over what it holds: the dashboard's state (``tui.state``), the trace summary
(``trace_tools.summary``), the Prometheus metrics (``metrics``) and the state keeper a viewer
attaching mid-run is replayed from (``state_keeper``). Each reader owns its own fold, on its own
thread (the dashboard's, the summary's caller, the metrics' subscriber thread, the endpoint's
publisher thread): none runs on the engine's step thread, which only publishes.

What a fold remembers beyond counts is bounded by its ``FoldLimits``: a dashboard stays open for days,
the summary of a trace wants every sample. The facts are grouped: steps (``fold_steps``), requests
(``fold_requests``), capture passes and their costs (``capture``), a recapture from request to result
(``recapture``); the rest (engine, memory, KV, alerts, parity, ranks) is small enough to live here.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from .capture import BucketCost, CaptureTracker
from .events import (
    CaptureFinished,
    CaptureProgress,
    CaptureStarted,
    ConfigDowngrade,
    EngineStarted,
    ErrorEvent,
    Event,
    KVPoolState,
    LoadProgress,
    MemoryLedger,
    ParityCheck,
    ParityNotRun,
    RankReplay,
    RecaptureFinished,
    RecaptureRequested,
    TraceHeader,
)
from .fold_requests import RequestFacts
from .fold_steps import StepFacts
from .history import History, KeyedSamples, Samples
from .measured import measured
from .recapture import RecaptureTracker
from .tallies import ParityTally

__all__ = ["FoldLimits", "RECENT_REFUSALS", "REFUSAL_WHERE", "Revisions", "RunFold"]

REFUSAL_WHERE = "telemetry endpoint"
"""``ErrorEvent.where`` of the endpoint's own refusals of clients."""
RECENT_REFUSALS = 5
"""Refusals a bounded fold keeps, apart from the engine's errors: a client sending junk at the
refusal log's rate would otherwise push every real engine error out of what is remembered."""


@dataclass(frozen=True)
class FoldLimits:
    """How much a fold remembers besides its counts (None: everything, for a trace read once)."""

    steps: Optional[int] = 4096  # recent step events
    samples: Optional[int] = 240  # samples per timing (0: none kept; listeners still hear them)
    alerts: Optional[int] = 50  # config downgrades, and errors
    captures: Optional[int] = 8  # capture passes in ``captures.passes``
    open_requests: int = 10_000  # requests between queued and finished
    step_numbers: bool = False  # every step number, for the gaps a dropped event leaves (offline)
    step_tallies: bool = True  # False: steps are only remembered, not counted (see ``StepFacts``)

    @classmethod
    def everything(cls) -> "FoldLimits":
        return cls(steps=None, samples=None, alerts=None, captures=None, step_numbers=True)


class Revisions(dict[str, int]):
    """Changes per area of the dashboard ("steps", "capture", ...); an area never changed reads 0.
    A plain dict underneath: ``Counter``'s ``+=`` costs four times as much, on every event."""

    def __missing__(self, area: str) -> int:
        return 0


class RunFold:
    """Everything the event stream says about one run. ``seq`` numbers the events in the order they
    were applied; ``revs`` counts the changes of each area, so a view redraws only what moved."""

    def __init__(self, limits: FoldLimits = FoldLimits()) -> None:
        self.limits = limits
        self.seq = 0  # events applied so far: the next one's sequence number
        self.counts: dict[str, int] = {}  # event type -> events
        self.revs = Revisions()
        self.header: Optional[TraceHeader] = None
        self.first_ts: Optional[float] = None  # earliest and latest ts, the header left out
        self.last_ts: Optional[float] = None
        self.latest_ts: Optional[float] = None  # the ts of the event applied last
        self._stamp: dict[str, int] = {}  # fact -> seq of the event that holds it (see ``retained``)
        # the engine and its memory
        self.info: Optional[EngineStarted] = None
        self.load_progress: Optional[LoadProgress] = None  # a long load's latest step, until started
        self.ledgers: dict[int, MemoryLedger] = {}  # every tensor-parallel rank's latest
        self.kv: Optional[KVPoolState] = None
        self.kv_peak_used = 0
        self.kv_used = Samples(limits.samples)  # fraction of the pool in use, per kv_pool event
        # capture
        self.captures = CaptureTracker(history=limits.captures)
        self.capture_events: dict[tuple[int, str], list[tuple[int, Event]]] = {}  # (rank, phase): latest pass
        self.costs: dict[tuple[str, int], BucketCost] = {}  # rank 0's latest measured cost per bucket
        self.capture_failures: Counter[str] = Counter()  # rank 0's failed buckets by phase
        self.graphs_captured: dict[str, int] = {}  # phase -> buckets captured by rank 0's latest pass
        self.recapture_pending: Optional[RecaptureRequested] = None
        self.last_recapture: Optional[RecaptureFinished] = None
        self.recapture = RecaptureTracker()  # estimate, progress and cost of the one under way / last
        self.recapture_results: Counter[str] = Counter()  # ok | failed
        self.recapture_causes: Counter[str] = Counter()  # cause as given -> requests
        # steps, requests, ranks, parity, alerts
        self.steps = StepFacts(limits.steps, limits.samples, limits.step_numbers, limits.step_tallies)
        self.requests = RequestFacts(limits.samples, limits.open_requests)
        self.rank_replay: KeyedSamples[int] = KeyedSamples(limits.samples)  # worker ranks' replay ms
        self.parity = ParityTally()
        self.parity_last: Optional[ParityCheck] = None
        self.parity_checks: Counter[str] = Counter()  # by phase
        self.parity_mismatches: Counter[str] = Counter()
        self.downgrades: History[ConfigDowngrade] = History(limits.alerts)
        self.errors: History[ErrorEvent] = History(limits.alerts)  # the engine's
        refusals = RECENT_REFUSALS if limits.alerts is not None else None
        self.refusals: History[ErrorEvent] = History(refusals)  # the endpoint's refusals of clients
        self.errors_by_where: Counter[str] = Counter()  # every error, refusals included
        self.failed: Optional[str] = None  # the message of the fatal error, once one came
        self.rank_deaths: dict[int, str] = {}  # rank -> the fatal error that named it

    # ------------------------------------------------------------------ folding
    def apply(self, ev: Event) -> None:
        """Fold one event in; an event type the fold does not know is counted and otherwise ignored."""
        seq = self.seq
        self.seq = seq + 1
        kind = ev.type
        counts = self.counts
        counts[kind] = counts.get(kind, 0) + 1
        ts = ev.ts
        self.latest_ts = ts
        if kind != "header":
            if self.first_ts is None or ts < self.first_ts:
                self.first_ts = ts
            if self.last_ts is None or ts > self.last_ts:
                self.last_ts = ts
        handler = _HANDLERS.get(kind)
        if handler is not None:
            handler(self, seq, ev)

    def apply_all(self, events: Iterable[Event]) -> int:
        n = 0
        for ev in events:
            self.apply(ev)
            n += 1
        return n

    # ------------------------------------------------------------------ reading
    @property
    def ledger(self) -> Optional[MemoryLedger]:
        """Rank 0's latest ledger (the engine's own device)."""
        return self.ledgers.get(0)

    @property
    def kv_usage(self) -> float:
        """The fraction of the KV pool in use (0 before any ``kv_pool`` event or with no pool)."""
        kv = self.kv
        return kv.used_tokens / kv.capacity_tokens if kv is not None and kv.capacity_tokens else 0.0

    @property
    def emulated(self) -> bool:
        return bool(self.info is not None and self.info.emulated) or self.steps.emulated > 0

    def all_errors(self) -> list[ErrorEvent]:
        """The errors remembered, the endpoint's refusals among them, in stream order."""
        return [ev for _, ev in heapq.merge(self.errors.stamped(), self.refusals.stamped(), key=_seq)]

    def retained(self) -> list[Event]:
        """The events that still describe the engine, in the order it published them: folding them into
        an empty fold gives what a fold that saw the whole stream holds of the engine, its capture
        passes, memory, KV, recapture, the open requests, the recent steps and alerts. The state keeper
        sends these to a viewer that attaches mid-run."""
        latest = [(seq, self._fact(name)) for name, seq in self._stamp.items()]
        parts: list[Iterable[tuple[int, Any]]] = [
            sorted(latest, key=_seq),
            self.downgrades.stamped(),
            self.errors.stamped(),
            self.refusals.stamped(),
            self.steps.recent.stamped(),
            *self.capture_events.values(),
            *(req.events for req in self.requests.open.values()),
        ]
        return [ev for _, ev in heapq.merge(*parts, key=_seq)]

    def _fact(self, name: str) -> Event:
        kind, _, rank = name.partition("/")
        if kind == "memory_ledger":
            return self.ledgers[int(rank)]
        return getattr(self, _FACTS[kind])  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ handlers
    def _on_header(self, seq: int, ev: TraceHeader) -> None:
        self.header = ev

    def _on_started(self, seq: int, ev: EngineStarted) -> None:
        self.info = ev
        self._stamp["engine_started"] = seq
        self._stamp.pop("load_progress", None)
        self.load_progress = None
        self.revs["info"] += 1

    def _on_load_progress(self, seq: int, ev: LoadProgress) -> None:
        self.load_progress = ev
        self._stamp["load_progress"] = seq
        self.revs["info"] += 1

    def _on_capture_started(self, seq: int, ev: CaptureStarted) -> None:
        self.captures.apply(ev)
        self.capture_events[(ev.rank, ev.phase)] = [(seq, ev)]
        if ev.rank == 0:
            self.recapture.capture_started(ev)
            self.steps.capture_started(ev.phase)
        self.revs["capture"] += 1
        self.revs["hist"] += 1

    def _on_capture_progress(self, seq: int, ev: CaptureProgress) -> None:
        cap = self.captures.apply(ev)
        self.capture_events.setdefault((ev.rank, ev.phase), []).append((seq, ev))
        if ev.rank == 0:  # rank 0 stands for all: every rank captures the same buckets
            self.recapture.capture_progress(ev)
            if ev.ok:  # failed captures are no basis for estimates
                self.costs[(ev.phase, ev.bucket)] = cap.costs[-1]
            else:
                self.capture_failures[ev.phase] += 1
        self.revs["capture"] += 1

    def _on_capture_finished(self, seq: int, ev: CaptureFinished) -> None:
        self.captures.apply(ev)
        self.capture_events.setdefault((ev.rank, ev.phase), []).append((seq, ev))
        if ev.rank == 0:
            self.graphs_captured[ev.phase] = len(ev.captured)
        self.revs["capture"] += 1

    def _on_ledger(self, seq: int, ev: MemoryLedger) -> None:
        self.ledgers[ev.rank] = ev
        self._stamp[f"memory_ledger/{ev.rank}"] = seq
        self.revs["ledger"] += 1

    def _on_kv(self, seq: int, ev: KVPoolState) -> None:
        self.kv = ev
        self._stamp["kv_pool"] = seq
        self.kv_peak_used = max(self.kv_peak_used, ev.used_tokens)
        self.kv_used.add(self.kv_usage)
        self.revs["kv"] += 1

    def _on_step(self, seq: int, ev: Any) -> None:
        revs = self.revs
        if self.steps.add(seq, ev):
            revs["capture"] += 1  # the capture panel says why the rest run eagerly
        revs["steps"] += 1
        revs["hist"] += 1

    def _on_rank_replay(self, seq: int, ev: RankReplay) -> None:
        for value in ev.replay_ms:
            ms = measured(value)
            if ms is not None:
                self.rank_replay.add(ev.rank, ms)
        self.revs["steps"] += 1

    def _on_request_queued(self, seq: int, ev: Any) -> None:
        self.requests.on_queued(seq, ev)
        self.revs["requests"] += 1

    def _on_first_token(self, seq: int, ev: Any) -> None:
        self.requests.on_first_token(seq, ev)
        self.revs["requests"] += 1

    def _on_request_finished(self, seq: int, ev: Any) -> None:
        self.requests.on_finished(ev)
        self.revs["requests"] += 1

    def _on_recapture_requested(self, seq: int, ev: RecaptureRequested) -> None:
        self.recapture_pending = ev
        self._stamp["recapture_requested"] = seq
        self.recapture.requested(ev, self.costs.values())
        self.recapture_causes[ev.cause] += 1
        self.revs["capture"] += 1

    def _on_recapture_finished(self, seq: int, ev: RecaptureFinished) -> None:
        self.recapture_pending = None
        self._stamp.pop("recapture_requested", None)
        self.last_recapture = ev
        self._stamp["recapture_finished"] = seq
        self.recapture.finished(ev)
        self.recapture_results["ok" if ev.ok else "failed"] += 1
        self.revs["capture"] += 1

    def _on_downgrade(self, seq: int, ev: ConfigDowngrade) -> None:
        self.downgrades.add(seq, ev)
        self.revs["alerts"] += 1

    def _on_parity(self, seq: int, ev: ParityCheck) -> None:
        self.parity.add(ev)
        self.parity_last = ev
        self.parity_checks[ev.phase] += 1
        if ev.mismatch:
            self.parity_mismatches[ev.phase] += 1
        self.revs["parity"] += 1

    def _on_parity_not_run(self, seq: int, ev: ParityNotRun) -> None:
        self.parity.not_run(ev)
        self.revs["parity"] += 1

    def _on_error(self, seq: int, ev: ErrorEvent) -> None:
        (self.refusals if ev.where == REFUSAL_WHERE else self.errors).add(seq, ev)
        self.errors_by_where[ev.where] += 1
        if ev.fatal:
            self.failed = ev.message
            if ev.rank is not None:
                self.rank_deaths[ev.rank] = ev.message
                self.revs["capture"] += 1
        self.revs["alerts"] += 1


def _seq(item: tuple[int, Any]) -> int:
    return item[0]


_FACTS = {  # a fact ``retained`` returns -> the attribute that holds its event
    "engine_started": "info",
    "load_progress": "load_progress",
    "kv_pool": "kv",
    "recapture_requested": "recapture_pending",
    "recapture_finished": "last_recapture",
}

_HANDLERS: dict[str, Callable[[RunFold, int, Any], None]] = {  # by the events' ``type`` tags
    "header": RunFold._on_header,
    "engine_started": RunFold._on_started,
    "load_progress": RunFold._on_load_progress,
    "capture_started": RunFold._on_capture_started,
    "capture_progress": RunFold._on_capture_progress,
    "capture_finished": RunFold._on_capture_finished,
    "memory_ledger": RunFold._on_ledger,
    "kv_pool": RunFold._on_kv,
    "step": RunFold._on_step,
    "rank_replay": RunFold._on_rank_replay,
    "request_queued": RunFold._on_request_queued,
    "request_first_token": RunFold._on_first_token,
    "request_finished": RunFold._on_request_finished,
    "recapture_requested": RunFold._on_recapture_requested,
    "recapture_finished": RunFold._on_recapture_finished,
    "config_downgrade": RunFold._on_downgrade,
    "parity_check": RunFold._on_parity,
    "parity_not_run": RunFold._on_parity_not_run,
    "error": RunFold._on_error,
}
