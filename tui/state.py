"""The dashboard's model: a view over the engine's event stream folded into bounded, render-ready state.

The folding itself is ``engine.telemetry.fold.RunFold``, the one the trace summary, the metrics and
the state keeper read too, so the dashboard counts a step exactly as they do; this class names the
facts the panels read, keeps the events as they came (to save them as a trace), and adds what only
the dashboard knows (the live advice, the parity setting the app sent). No textual import: widgets are
thin views over this, so what the dashboard *knows* can be tested without a terminal, and the replay
session can rebuild it from scratch when seeking backwards. Every history is bounded
(``FoldLimits``) so a dashboard left open for a week stays flat in memory. ``revs`` counts changes per
area; a widget re-renders only when its area's revision moved.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, deque
from typing import Iterable, Optional

from graphtop.engine.telemetry.capture import BucketCost, CapturePass
from graphtop.engine.telemetry.events import (
    ConfigDowngrade,
    EngineStarted,
    ErrorEvent,
    Event,
    KVPoolState,
    LoadProgress,
    MemoryLedger,
    ParityCheck,
    RecaptureFinished,
    RecaptureRequested,
    StepEvent,
)
from graphtop.engine.telemetry.fold import FoldLimits, Revisions, RunFold
from graphtop.engine.telemetry.measured import measured
from graphtop.engine.telemetry.recapture import RecaptureTracker
from graphtop.engine.telemetry.tallies import BucketTally, HitTally, ParityTally
from graphtop.engine.telemetry.value_limits import MAX_INT

from .whatif import WhatIfInputs

CAPTURE_HISTORY = 8
"""Capture passes kept (the latest of each phase is what the panels show)."""
RANK_WINDOW = 64
"""Recent replay times per tensor-parallel rank that 'slowest rank' compares."""
_BUCKET_KEYS = {"decode": "bs", "prefill": "num_tokens"}


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
        step_history: Optional[int] = 16384,
        spark_history: int = 240,
        event_history: int = 200_000,
        alert_history: int = 50,
    ) -> None:
        self.fold = RunFold(
            FoldLimits(steps=step_history, samples=spark_history, alerts=alert_history, captures=CAPTURE_HISTORY)
        )
        self.recorded: deque[Event] = deque(maxlen=event_history)  # as they came, for saving a trace
        self.live_advice = ""  # the live advice's headline ("advice ready: ..."); "" when none is ready
        self.parity_setting: Optional[int] = None  # what the live engine was told (the app sets it)

    # ------------------------------------------------------------------ the fold's facts, by name
    @property
    def revs(self) -> Revisions:
        return self.fold.revs

    @property
    def info(self) -> Optional[EngineStarted]:
        return self.fold.info

    @property
    def load_progress(self) -> Optional[LoadProgress]:
        """A long load's latest step (a .gguf's conversion), until the engine started."""
        return self.fold.load_progress

    @property
    def costs(self) -> dict[tuple[str, int], BucketCost]:
        return self.fold.costs

    @property
    def ledger(self) -> Optional[MemoryLedger]:
        """Rank 0's (the engine's own device)."""
        return self.fold.ledger

    @property
    def ledgers(self) -> dict[int, MemoryLedger]:
        return self.fold.ledgers

    @property
    def rank_replay_ms(self) -> dict[int, list[float]]:
        """Worker ranks' recent replay times (the last ``RANK_WINDOW``)."""
        return {r: list(s.values)[-RANK_WINDOW:] for r, s in self.fold.rank_replay.by_key.items()}

    @property
    def rank_deaths(self) -> dict[int, str]:
        return self.fold.rank_deaths

    @property
    def kv(self) -> Optional[KVPoolState]:
        return self.fold.kv

    @property
    def kv_used(self) -> deque[float]:
        return self.fold.kv_used.values

    @property
    def steps(self) -> deque[StepEvent]:
        """Recent steps, their timings made displayable (``recorded`` keeps them as they came)."""
        return self.fold.steps.recent.events

    @property
    def replay_ms(self) -> deque[float]:
        return self.fold.steps.replay_ms.values

    @property
    def bucket_stats(self) -> dict[tuple[str, int], BucketTally]:
        """Hits per (bucket list's phase, bucket) on the graphs in use."""
        return self.fold.steps.in_use

    @property
    def fallbacks(self) -> Counter[str]:
        return self.fold.steps.fallback_reasons("unspecified")

    @property
    def last_fallback(self) -> Optional[str]:
        return self.fold.steps.last_fallback

    @property
    def hits(self) -> HitTally:
        """Every step seen, counted as the trace report counts them."""
        return self.fold.steps.hits

    @property
    def emulated_steps(self) -> int:
        return self.fold.steps.emulated

    @property
    def recapture_pending(self) -> Optional[RecaptureRequested]:
        return self.fold.recapture_pending

    @property
    def last_recapture(self) -> Optional[RecaptureFinished]:
        return self.fold.last_recapture

    @property
    def recapture(self) -> RecaptureTracker:
        """Estimate, progress and cost of the recapture under way / last."""
        return self.fold.recapture

    @property
    def downgrades(self) -> deque[ConfigDowngrade]:
        return self.fold.downgrades.events

    @property
    def errors(self) -> list[ErrorEvent]:
        return self.fold.all_errors()

    @property
    def requests_queued(self) -> int:
        return self.fold.requests.queued

    @property
    def requests_finished(self) -> int:
        return self.fold.requests.finished

    @property
    def ttft_ms(self) -> deque[float]:
        return self.fold.requests.ttft_ms.values

    @property
    def events_seen(self) -> int:
        return self.fold.seq

    @property
    def last_ts(self) -> Optional[float]:
        return self.fold.latest_ts

    @property
    def failed(self) -> Optional[str]:
        """Why the engine (or the session feeding this state) failed; None while it runs."""
        return self.fold.failed

    @failed.setter
    def failed(self, message: Optional[str]) -> None:
        self.fold.failed = message

    @property
    def parity(self) -> ParityTally:
        """Graph-vs-eager checks, counted as the trace report counts them."""
        return self.fold.parity

    @property
    def parity_last(self) -> Optional[ParityCheck]:
        return self.fold.parity_last

    # ------------------------------------------------------------------ queries
    @property
    def loading(self) -> bool:
        """True until the engine said what it runs (the model is still loading)."""
        return self.info is None and self.failed is None

    @property
    def emulated(self) -> bool:
        return self.fold.emulated

    @property
    def capture(self) -> dict[str, CapturePass]:
        """Each phase's latest capture pass (initial or recapture)."""
        return self.fold.captures.latest

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
        return max(self.info.tp_size if self.info else 1, len(self.ledgers), len(self.fold.captures.ranks))

    @property
    def rank_captures(self) -> dict[int, dict[str, CapturePass]]:
        """Every rank's latest capture pass per phase."""
        return self.fold.captures.ranks

    def slowest_rank(self) -> Optional[tuple[int, float]]:
        """(rank, mean replay ms over its last ``RANK_WINDOW`` replays) of the slowest rank; None
        without tensor parallelism or before every rank replayed. A step takes as long as its slowest
        rank: the collectives inside make the others wait for it."""
        if self.tp_size < 2:
            return None
        windows = {0: list(self.replay_ms)[-RANK_WINDOW:], **self.rank_replay_ms}
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
        """Record one event as it came and fold it in (``RunFold`` decides what it means)."""
        self.recorded.append(ev)
        self.fold.apply(ev)
