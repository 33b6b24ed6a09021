"""The dashboard's model: folds engine events into bounded, render-ready state.

No textual import: widgets are thin views over this, so what the dashboard *knows* can be tested
without a terminal, and the replay session can rebuild it from scratch when seeking backwards.
Every history is a ``deque(maxlen=…)`` so a dashboard left open for a week stays flat in memory.
``revs`` counts changes per area; a widget re-renders only when its area's revision moved.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, deque
from typing import Any, Iterable, Optional

from graphtop.engine.telemetry.capture import BucketCost, CapturePass, CaptureTracker
from graphtop.engine.telemetry.events import (
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
    RequestFinished,
    RequestFirstToken,
    RequestQueued,
    StepEvent,
)
from graphtop.engine.telemetry.value_limits import MAX_FLOAT, MAX_INT
from graphtop.engine.trace_tools.stats import BucketTally, HitTally, ParityTally, step_phase

from .sessions.recapture_state import RecaptureTracker
from .whatif import WhatIfInputs

CAPTURE_HISTORY = 8
"""Capture passes kept (the latest of each phase is what the panels show)."""
RANK_WINDOW = 64
"""Recent replay times per tensor-parallel rank that 'slowest rank' compares."""
_BUCKET_KEYS = {"decode": "bs", "prefill": "num_tokens"}


def measured(value: Any) -> Optional[float]:
    """``value`` if it is a number a trace may hold (finite, 0..2**53: ``value_limits``), else None.

    Events from an attached engine are decoded by type only (a buggy or hostile engine can send NaN,
    infinities or negative timings); such a value is no measurement, and one NaN in a chart's data
    crashes Textual's ``Sparkline`` (``int(nan)``) while an infinity poisons every mean and percentile.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if 0.0 <= value <= MAX_FLOAT else None  # also False for NaN


def _finite_step(ev: StepEvent) -> StepEvent:
    """``ev`` with its timings and padding share made displayable (see ``measured``): an optional one
    that is no measurement becomes None (the table shows "—", the charts skip it), a required one 0.0
    (neutral in the sums the tallies and the what-if make; None there would break their arithmetic)."""
    r, g, b = ev.replay_ms, ev.segment_ms, ev.break_ms
    try:  # every step is folded: the usual all-valid step costs these comparisons only
        if (
            0.0 <= ev.host_ms <= MAX_FLOAT
            and 0.0 <= ev.padding_waste <= MAX_FLOAT
            and (r is None or 0.0 <= r <= MAX_FLOAT)
            and (g is None or 0.0 <= g <= MAX_FLOAT)
            and (b is None or 0.0 <= b <= MAX_FLOAT)
        ):
            return ev
    except TypeError:  # not a number at all: the checks below say which
        pass
    fixes: dict[str, Optional[float]] = {}
    for name in ("replay_ms", "segment_ms", "break_ms"):
        value = getattr(ev, name)
        if value is not None and measured(value) is None:
            fixes[name] = None
    for name in ("host_ms", "padding_waste"):
        if measured(getattr(ev, name)) is None:
            fixes[name] = 0.0
    return dataclasses.replace(ev, **fixes) if fixes else ev


@dataclasses.dataclass(frozen=True)
class PhaseGraphs:
    """One phase's part of ``EngineStarted.graph_config``, type-checked (see ``phase_graphs``)."""

    backend: Optional[str] = None
    buckets: tuple[int, ...] = ()
    max_padding_waste: Optional[float] = None


class DashboardState:
    """Everything the panels show, built only from events (live, fake or replayed alike)."""

    def __init__(
        self,
        *,
        step_history: int = 16384,
        spark_history: int = 240,
        event_history: int = 200_000,
        alert_history: int = 50,
    ) -> None:
        self.revs: Counter[str] = Counter()
        self.info: Optional[EngineStarted] = None
        self.load_progress: Optional[LoadProgress] = None  # a long load's latest step (a .gguf's conversion)
        self._captures = CaptureTracker(history=CAPTURE_HISTORY)
        self.costs: dict[tuple[str, int], BucketCost] = {}
        self.ledger: Optional[MemoryLedger] = None  # rank 0's (the engine's own device)
        self.ledgers: dict[int, MemoryLedger] = {}  # every tensor-parallel rank's latest
        self.rank_replay_ms: dict[int, deque[float]] = {}  # worker ranks' recent replay times
        self.rank_deaths: dict[int, str] = {}  # rank -> the fatal error that named it
        self.kv: Optional[KVPoolState] = None
        self.kv_used: deque[float] = deque(maxlen=spark_history)
        self.steps: deque[StepEvent] = deque(maxlen=step_history)
        self.live_advice = ""  # the live advice's headline ("advice ready: ..."); "" when none is ready
        self.replay_ms: deque[float] = deque(maxlen=spark_history)
        self.bucket_stats: dict[tuple[str, int], BucketTally] = {}
        self.fallbacks: Counter[str] = Counter()
        self.last_fallback: Optional[str] = None  # the reason of the latest eager step
        self.hits = HitTally()  # every step seen, counted as the trace report counts them
        self.emulated_steps = 0
        self.recapture_pending: Optional[RecaptureRequested] = None
        self.last_recapture: Optional[RecaptureFinished] = None
        self.recapture = RecaptureTracker()  # estimate, progress and cost of the recapture under way / last
        self.downgrades: deque[ConfigDowngrade] = deque(maxlen=alert_history)
        self.errors: deque[ErrorEvent] = deque(maxlen=alert_history)
        self.requests_queued = 0
        self.requests_finished = 0
        self.ttft_ms: deque[float] = deque(maxlen=spark_history)
        self.recorded: deque[Event] = deque(maxlen=event_history)
        self.events_seen = 0
        self.last_ts: Optional[float] = None
        self.failed: Optional[str] = None
        self.parity = ParityTally()  # graph-vs-eager checks, counted as the trace report counts them
        self.parity_last: Optional[ParityCheck] = None
        self.parity_setting: Optional[int] = None  # what the live engine was told (the app sets it)

    # ------------------------------------------------------------------ queries
    @property
    def loading(self) -> bool:
        """True until the engine said what it runs (the model is still loading)."""
        return self.info is None and self.failed is None

    @property
    def emulated(self) -> bool:
        return bool(self.info and self.info.emulated) or self.emulated_steps > 0

    @property
    def capture(self) -> dict[str, CapturePass]:
        """Each phase's latest capture pass (initial or recapture)."""
        return self._captures.latest

    @property
    def graphs_planned(self) -> bool:
        """The engine means to capture graphs (some phase has buckets after limits and downgrades)."""
        return bool(self.planned_phases())

    def phase_graphs(self, phase: str) -> PhaseGraphs:
        """``phase``'s part of the engine's resolved graph config, with every value the dashboard reads
        type-checked here, in one place: ``graph_config`` is a free-form dict on the wire, so an
        attached engine (another version, or a buggy one) can send anything in it. A malformed part
        reads as absent, which every caller already handles (an engine that said nothing about it)."""
        config = self.info.graph_config if self.info is not None else None
        body = config.get(phase) if isinstance(config, dict) else None
        if not isinstance(body, dict):
            return PhaseGraphs()
        backend = body.get("backend")
        sizes = body.get(_BUCKET_KEYS.get(phase, ""))
        valid = isinstance(sizes, (list, tuple)) and all(
            type(b) is int and 1 <= b <= MAX_INT for b in sizes
        )  # type(): a bool is no bucket
        return PhaseGraphs(
            backend=backend if isinstance(backend, str) else None,
            buckets=tuple(sizes) if valid else (),
            max_padding_waste=measured(body.get("max_padding_waste")),
        )

    def graphs_disabled(self, phase: str) -> bool:
        """The engine runs ``phase`` without graphs (``--cuda-graph-backend-PHASE disabled``): it has
        no list to edit, and a recapture must leave it out (None), not send an empty list."""
        return self.phase_graphs(phase).backend == "disabled"

    def planned_phases(self) -> list[str]:
        """The phases the engine said it will capture (its resolved graph config): a phase without a
        capture pass yet means capture is not over, even when the other phase's pass has finished."""
        config = self.info.graph_config if self.info is not None else None
        if isinstance(config, dict) and not config.get("available", True):
            return []
        return [
            phase for phase in _BUCKET_KEYS if (part := self.phase_graphs(phase)).backend != "disabled" and part.buckets
        ]

    @property
    def capturing(self) -> bool:
        """A capture pass is running (the engine serves meanwhile: steps whose bucket is still to
        come run eagerly)."""
        return any(cap.finished is None for cap in self.capture.values())

    def buckets_live(self) -> tuple[int, int]:
        """(captured, asked for) over each phase's latest pass: how much of the graph set serves now."""
        passes = self.capture.values()
        return sum(len(c.captured) for c in passes), sum(c.total for c in passes)

    @property
    def total_steps(self) -> int:
        return self.hits.steps

    @property
    def graph_steps(self) -> int:
        return self.hits.graph_steps

    def current_buckets(self, phase: str) -> list[int]:
        """Buckets of the last capture of ``phase`` (captured ones once it finished)."""
        cap = self.capture.get(phase)
        if cap is None:
            return []
        return sorted(cap.captured if cap.finished else cap.planned)

    def bucket_costs(self) -> list[BucketCost]:
        return sorted(self.costs.values(), key=lambda c: (c.phase, c.bucket))

    def prefill_padding_cap(self) -> Optional[float]:
        """The engine's prefill padding cap, from its resolved graph config (None before it started)."""
        return self.phase_graphs("prefill").max_padding_waste

    def graph_max_bucket(self, phase: str) -> Optional[int]:
        """The largest bucket the engine's static buffers hold: the maximum of the list it started with
        (the model runner sizes them once, so a recapture cannot go past it)."""
        sizes = self.phase_graphs(phase).buckets
        return max(sizes) if sizes else None

    def whatif_inputs(self) -> WhatIfInputs:
        return WhatIfInputs(tuple(self.steps), tuple(self.bucket_costs()), self.prefill_padding_cap())

    def hit_rate(self) -> Optional[float]:
        return self.hits.hit_rate

    @property
    def parity_every(self) -> int:
        """One graph step in N is checked (0: off): the live setting, else what the checks said."""
        return self.parity_setting if self.parity_setting is not None else self.parity.every

    def set_parity_setting(self, every: int) -> None:
        self.parity_setting = every
        self.revs["parity"] += 1

    # ------------------------------------------------------------------ tensor parallel
    @property
    def tp_size(self) -> int:
        return max(self.info.tp_size if self.info else 1, len(self.ledgers), len(self._captures.ranks))

    @property
    def rank_captures(self) -> dict[int, dict[str, CapturePass]]:
        """Every rank's latest capture pass per phase."""
        return self._captures.ranks

    def slowest_rank(self) -> Optional[tuple[int, float]]:
        """(rank, mean replay ms over its last ``RANK_WINDOW`` replays) of the slowest rank; None
        without tensor parallelism or before every rank replayed. A step takes as long as its slowest
        rank: the collectives inside make the others wait for it."""
        if self.tp_size < 2:
            return None
        windows = {0: list(self.replay_ms)[-RANK_WINDOW:], **{r: list(d) for r, d in self.rank_replay_ms.items()}}
        means = {r: sum(w) / len(w) for r, w in windows.items() if w}
        if len(means) < self.tp_size:
            return None
        rank = max(means, key=lambda r: (means[r], -r))
        return rank, means[rank]

    def rank_alerts(self) -> list[str]:
        """One line per rank that died, or whose capture failed a bucket (every rank then runs that
        bucket eagerly: a step replays the same graph on every rank or on none)."""
        lines = [msg for _, msg in sorted(self.rank_deaths.items())]  # "tensor-parallel rank N died (...)"
        for rank, phases in sorted(self.rank_captures.items()):
            if self.tp_size < 2:
                break
            for phase, cap in phases.items():
                for bucket, why in sorted(cap.failed.items()):
                    lines.append(
                        f"rank {rank}: {phase} bucket {bucket} failed ({why or 'no reason'}); "
                        "every rank runs it eagerly"
                    )
        return lines

    # ------------------------------------------------------------------ folding
    def apply_all(self, events: Iterable[Event]) -> int:
        n = 0
        for ev in events:
            self.apply(ev)
            n += 1
        return n

    def apply(self, ev: Event) -> None:
        """Fold one event in; unknown event types are recorded and otherwise ignored."""
        self.recorded.append(ev)
        self.events_seen += 1
        self.last_ts = ev.ts
        handler = _HANDLERS.get(ev.type)
        if handler is not None:
            handler(self, ev)

    def _on_started(self, ev: EngineStarted) -> None:
        self.info = ev
        self.load_progress = None
        self.revs["info"] += 1

    def _on_load_progress(self, ev: LoadProgress) -> None:
        self.load_progress = ev
        self.revs["info"] += 1

    def _on_capture_started(self, ev: CaptureStarted) -> None:
        self._captures.apply(ev)
        if ev.rank == 0:
            self.recapture.capture_started(ev)
            # the phase's old graphs are gone: their hits no longer describe the graphs in use (hits
            # while this pass captures are on its own buckets, and stay)
            self.bucket_stats = {k: v for k, v in self.bucket_stats.items() if k[0] != ev.phase}
        self.revs["capture"] += 1
        self.revs["hist"] += 1

    def _on_capture_progress(self, ev: CaptureProgress) -> None:
        cap = self._captures.apply(ev)
        if ev.rank == 0:  # rank 0 stands for all
            self.recapture.capture_progress(ev)
        if ev.ok and ev.rank == 0:  # failed captures are no basis for estimates; rank 0 stands for all
            self.costs[(ev.phase, ev.bucket)] = cap.costs[-1]
        self.revs["capture"] += 1

    def _on_capture_finished(self, ev: CaptureFinished) -> None:
        self._captures.apply(ev)
        self.revs["capture"] += 1

    def _on_ledger(self, ev: MemoryLedger) -> None:
        self.ledgers[ev.rank] = ev
        if ev.rank == 0:
            self.ledger = ev
        self.revs["ledger"] += 1

    def _on_rank_replay(self, ev: RankReplay) -> None:
        window = self.rank_replay_ms.get(ev.rank)
        if window is None:
            window = self.rank_replay_ms[ev.rank] = deque(maxlen=RANK_WINDOW)
        window.extend(v for v in map(measured, ev.replay_ms) if v is not None)
        self.revs["steps"] += 1

    def _on_kv(self, ev: KVPoolState) -> None:
        self.kv = ev
        self.kv_used.append(ev.used_tokens / ev.capacity_tokens if ev.capacity_tokens else 0.0)
        self.revs["kv"] += 1

    def _on_step(self, ev: StepEvent) -> None:
        ev = _finite_step(ev)  # ``recorded`` keeps the event as it came; the panels read this one
        self.steps.append(ev)
        graph = ev.path == "graph"
        self.hits.add(graph, ev.bucket, ev.padded)
        if ev.emulated:
            self.emulated_steps += 1
        if graph:
            if ev.replay_ms is not None:
                self.replay_ms.append(ev.replay_ms)
            if ev.bucket is not None:
                key = (step_phase(ev.phase), ev.bucket)
                st = self.bucket_stats.get(key)
                if st is None:
                    st = self.bucket_stats[key] = BucketTally(ev.bucket)
                st.add(ev.padded, ev.padding_waste)
        else:
            self.fallbacks[ev.fallback_reason or "unspecified"] += 1
            if ev.fallback_reason != self.last_fallback:  # the capture panel says why the rest run eagerly
                self.last_fallback = ev.fallback_reason
                self.revs["capture"] += 1
        self.revs["steps"] += 1
        self.revs["hist"] += 1

    def _on_request_queued(self, ev: RequestQueued) -> None:
        self.requests_queued += 1
        self.revs["requests"] += 1

    def _on_first_token(self, ev: RequestFirstToken) -> None:
        ttft = measured(ev.ttft_ms)
        if ttft is not None:
            self.ttft_ms.append(ttft)
        self.revs["requests"] += 1

    def _on_request_finished(self, ev: RequestFinished) -> None:
        self.requests_finished += 1
        self.revs["requests"] += 1

    def _on_recapture_requested(self, ev: RecaptureRequested) -> None:
        self.recapture_pending = ev
        self.recapture.requested(ev, self.costs.values())
        self.revs["capture"] += 1

    def _on_recapture_finished(self, ev: RecaptureFinished) -> None:
        self.recapture_pending = None
        self.recapture.finished(ev)
        self.last_recapture = ev
        self.revs["capture"] += 1

    def _on_downgrade(self, ev: ConfigDowngrade) -> None:
        self.downgrades.append(ev)
        self.revs["alerts"] += 1

    def _on_parity(self, ev: ParityCheck) -> None:
        self.parity.add(ev)
        self.parity_last = ev
        self.revs["parity"] += 1

    def _on_parity_not_run(self, ev: ParityNotRun) -> None:
        self.parity.not_run(ev)
        self.revs["parity"] += 1

    def _on_error(self, ev: ErrorEvent) -> None:
        self.errors.append(ev)
        if ev.fatal:
            self.failed = ev.message
            if ev.rank is not None:
                self.rank_deaths[ev.rank] = ev.message
                self.revs["capture"] += 1
        self.revs["alerts"] += 1


_HANDLERS = {  # keyed by the events' ``type`` tags (see graphtop.engine.telemetry.events)
    "engine_started": DashboardState._on_started,
    "load_progress": DashboardState._on_load_progress,
    "capture_started": DashboardState._on_capture_started,
    "capture_progress": DashboardState._on_capture_progress,
    "capture_finished": DashboardState._on_capture_finished,
    "memory_ledger": DashboardState._on_ledger,
    "kv_pool": DashboardState._on_kv,
    "step": DashboardState._on_step,
    "rank_replay": DashboardState._on_rank_replay,
    "request_queued": DashboardState._on_request_queued,
    "request_first_token": DashboardState._on_first_token,
    "request_finished": DashboardState._on_request_finished,
    "recapture_requested": DashboardState._on_recapture_requested,
    "recapture_finished": DashboardState._on_recapture_finished,
    "config_downgrade": DashboardState._on_downgrade,
    "error": DashboardState._on_error,
    "parity_check": DashboardState._on_parity,
    "parity_not_run": DashboardState._on_parity_not_run,
}
