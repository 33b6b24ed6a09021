"""The dashboard's model: folds engine events into bounded, render-ready state.

No textual import: widgets are thin views over this, so what the dashboard *knows* can be tested
without a terminal, and the replay session can rebuild it from scratch when seeking backwards.
Every history is a ``deque(maxlen=…)`` so a dashboard left open for a week stays flat in memory.
``revs`` counts changes per area; a widget re-renders only when its area's revision moved.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Iterable, Optional

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
    MemoryLedger,
    RecaptureFinished,
    RecaptureRequested,
    RequestFinished,
    RequestFirstToken,
    RequestQueued,
    StepEvent,
)
from graphtop.engine.telemetry.stats import BucketTally, HitTally, step_phase

from .whatif import WhatIfInputs

CAPTURE_HISTORY = 8
"""Capture passes kept (the latest of each phase is what the panels show)."""


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
        self._captures = CaptureTracker(history=CAPTURE_HISTORY)
        self.costs: dict[tuple[str, int], BucketCost] = {}
        self.ledger: Optional[MemoryLedger] = None
        self.kv: Optional[KVPoolState] = None
        self.kv_used: deque[float] = deque(maxlen=spark_history)
        self.steps: deque[StepEvent] = deque(maxlen=step_history)
        self.replay_ms: deque[float] = deque(maxlen=spark_history)
        self.bucket_stats: dict[tuple[str, int], BucketTally] = {}
        self.fallbacks: Counter[str] = Counter()
        self.hits = HitTally()  # every step seen, counted as the trace report counts them
        self.emulated_steps = 0
        self.recapture_pending: Optional[RecaptureRequested] = None
        self.last_recapture: Optional[RecaptureFinished] = None
        self.downgrades: deque[ConfigDowngrade] = deque(maxlen=alert_history)
        self.errors: deque[ErrorEvent] = deque(maxlen=alert_history)
        self.requests_queued = 0
        self.requests_finished = 0
        self.ttft_ms: deque[float] = deque(maxlen=spark_history)
        self.recorded: deque[Event] = deque(maxlen=event_history)
        self.events_seen = 0
        self.last_ts: Optional[float] = None
        self.failed: Optional[str] = None

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
        config = (self.info.graph_config or {}) if self.info else {}
        if not config.get("available", True):
            return False
        return bool(config.get("decode", {}).get("bs") or config.get("prefill", {}).get("num_tokens"))

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
        prefill = (self.info.graph_config or {}).get("prefill", {}) if self.info else {}
        return prefill.get("max_padding_waste")

    def whatif_inputs(self) -> WhatIfInputs:
        return WhatIfInputs(tuple(self.steps), tuple(self.bucket_costs()), self.prefill_padding_cap())

    def hit_rate(self) -> Optional[float]:
        return self.hits.hit_rate

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
        self.revs["info"] += 1

    def _on_capture_started(self, ev: CaptureStarted) -> None:
        self._captures.apply(ev)
        # the phase's old graphs are gone: their hits no longer describe the graphs in use (hits
        # while this pass captures are on its own buckets, and stay)
        self.bucket_stats = {k: v for k, v in self.bucket_stats.items() if k[0] != ev.phase}
        self.revs["capture"] += 1
        self.revs["hist"] += 1

    def _on_capture_progress(self, ev: CaptureProgress) -> None:
        cap = self._captures.apply(ev)
        if ev.ok:  # failed captures are no basis for estimates
            self.costs[(ev.phase, ev.bucket)] = cap.costs[-1]
        self.revs["capture"] += 1

    def _on_capture_finished(self, ev: CaptureFinished) -> None:
        self._captures.apply(ev)
        self.revs["capture"] += 1

    def _on_ledger(self, ev: MemoryLedger) -> None:
        self.ledger = ev
        self.revs["ledger"] += 1

    def _on_kv(self, ev: KVPoolState) -> None:
        self.kv = ev
        self.kv_used.append(ev.used_tokens / ev.capacity_tokens if ev.capacity_tokens else 0.0)
        self.revs["kv"] += 1

    def _on_step(self, ev: StepEvent) -> None:
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
        self.revs["steps"] += 1
        self.revs["hist"] += 1

    def _on_request_queued(self, ev: RequestQueued) -> None:
        self.requests_queued += 1
        self.revs["requests"] += 1

    def _on_first_token(self, ev: RequestFirstToken) -> None:
        self.ttft_ms.append(ev.ttft_ms)
        self.revs["requests"] += 1

    def _on_request_finished(self, ev: RequestFinished) -> None:
        self.requests_finished += 1
        self.revs["requests"] += 1

    def _on_recapture_requested(self, ev: RecaptureRequested) -> None:
        self.recapture_pending = ev
        self.revs["capture"] += 1

    def _on_recapture_finished(self, ev: RecaptureFinished) -> None:
        self.recapture_pending = None
        self.last_recapture = ev
        self.revs["capture"] += 1

    def _on_downgrade(self, ev: ConfigDowngrade) -> None:
        self.downgrades.append(ev)
        self.revs["alerts"] += 1

    def _on_error(self, ev: ErrorEvent) -> None:
        self.errors.append(ev)
        if ev.fatal:
            self.failed = ev.message
        self.revs["alerts"] += 1


_HANDLERS = {  # keyed by the events' ``type`` tags (see graphtop.engine.telemetry.events)
    "engine_started": DashboardState._on_started,
    "capture_started": DashboardState._on_capture_started,
    "capture_progress": DashboardState._on_capture_progress,
    "capture_finished": DashboardState._on_capture_finished,
    "memory_ledger": DashboardState._on_ledger,
    "kv_pool": DashboardState._on_kv,
    "step": DashboardState._on_step,
    "request_queued": DashboardState._on_request_queued,
    "request_first_token": DashboardState._on_first_token,
    "request_finished": DashboardState._on_request_finished,
    "recapture_requested": DashboardState._on_recapture_requested,
    "recapture_finished": DashboardState._on_recapture_finished,
    "config_downgrade": DashboardState._on_downgrade,
    "error": DashboardState._on_error,
}
