"""Live bucket advice: a sliding window of demand, re-advised while traffic flows.

A server's mix drifts (short chat turns by day, long documents by night), and a list advised once goes
stale. ``LiveAdvisor`` folds an engine's events (any engine: in-process, ``graphtop serve``, attached)
into what the advisor needs: the last ``window`` steps of each phase, the lists in use, the capture
ledger, the prefill padding cap, the static buffers' largest bucket and the KV page size. ``propose``
advises both phases on that window (``bucket_demand.advise_phase``: every step a bucket could serve,
the largest size kept, the grid chosen on held-out steps) and returns a ``Proposal`` only for a phase
whose held-out step cost the advice lowers by at least ``threshold``: the earlier part of the window
chooses, the later part judges, so a proposal is a list that already did better on traffic it had not
seen. The dashboard shows it ("advice ready: ..."), and ``engine.auto_tune`` applies it.

The advice keeps the lists in use where the window does not pay for a change: it spends a graph
only where that saves at least ``bucket_holdout.MIN_GRAPH_GAIN`` of the ideal step cost, and the
graphs it leaves spare keep the current buckets (``spare_graphs``), so a window of short prompts does
not trade a dense list's long buckets for a shade less padding. It keeps each phase's graph count,
keeps its largest bucket (a window of recent steps has not seen every long request: a lull in long
prompts must not cost the next one its graph), and stays
within the static buffers (what a recapture accepts); with ``max_memory`` each phase's estimated graph
memory stays within it, and a phase whose memory cannot be estimated (no capture ledger yet) is not
proposed. Pure: no torch.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence

from ..telemetry.capture import BucketCost, cost_points, estimate_cost
from ..telemetry.events import (
    CaptureFinished,
    CaptureProgress,
    CaptureStarted,
    EngineStarted,
    Event,
    KVPoolState,
    RecaptureFinished,
    RecaptureRequested,
    StepEvent,
)
from ..telemetry.step_size import step_phase
from .bucket_demand import DEFAULT_HOLDOUT, advise_phase

__all__ = ["DEFAULT_THRESHOLD", "DEFAULT_WINDOW", "MIN_STEPS", "LiveAdvisor", "PhaseProposal", "Proposal", "propose"]

PHASES = ("decode", "prefill")
_KEYS = {"decode": "bs", "prefill": "num_tokens"}

DEFAULT_WINDOW = 4096
"""Steps of each phase the window keeps: enough for the held-out part to hold real traffic, few enough
that a shift in the mix fills it within minutes of serving."""
DEFAULT_THRESHOLD = 0.05
"""The held-out step cost a proposal must save: 5 %. Below it a recapture is not worth its work."""
MIN_STEPS = 32
"""A phase with fewer steps in the window is not advised: too little traffic to judge by."""


@dataclass(frozen=True)
class PhaseProposal:
    """One phase's advised list and what it saves on the held-out steps."""

    phase: str
    buckets: tuple[int, ...]
    current: tuple[int, ...]
    gain: float  # held-out step cost saved, a fraction (0.12: 12 % less)
    memory_now: Optional[float]  # estimated graph memory of the lists, from the capture ledger
    memory_new: Optional[float]
    steps: int  # the phase's steps in the window


@dataclass(frozen=True)
class Proposal:
    """The phases worth recapturing, with their lists."""

    phases: tuple[PhaseProposal, ...]

    def buckets(self, phase: str) -> Optional[list[int]]:
        """The advised list of ``phase``, None when it stays as it is (a recapture's argument)."""
        return next((list(p.buckets) for p in self.phases if p.phase == phase), None)

    @property
    def memory_delta(self) -> Optional[float]:
        """Estimated graph memory added (negative: freed); None when any part cannot be estimated."""
        parts = [(p.memory_new, p.memory_now) for p in self.phases]
        if any(new is None or now is None for new, now in parts):
            return None
        return float(sum(new - now for new, now in parts))  # type: ignore[operator]

    def headline(self) -> str:
        """ "advice ready: decode −12.0 %, prefill −30.5 % step cost, +4.0 MiB graphs"."""
        gains = ", ".join(f"{p.phase} −{100 * p.gain:.1f} %" for p in self.phases)
        delta = self.memory_delta
        mem = "graph memory unknown" if delta is None else f"{delta / 2**20:+.1f} MiB graphs"
        return f"advice ready: {gains} step cost, {mem}"


class LiveAdvisor:
    """Folds an engine's events into a window of demand and what the advisor needs beside it."""

    def __init__(self, window: int = DEFAULT_WINDOW) -> None:
        if window < 1:
            raise ValueError(f"the advice window must hold at least 1 step, got {window}")
        self.window: dict[str, deque[StepEvent]] = {ph: deque(maxlen=window) for ph in PHASES}
        self.current: dict[str, tuple[int, ...]] = {ph: () for ph in PHASES}
        self.max_bucket: dict[str, Optional[int]] = {ph: None for ph in PHASES}
        self.disabled: set[str] = set()
        self.max_padding_waste: Optional[float] = None
        self.page_size: Optional[int] = None
        self.costs: dict[tuple[str, int], BucketCost] = {}
        self.capturing: set[str] = set()  # phases whose capture runs now
        self.recapture_pending = False  # asked, not finished
        self.seen = 0  # steps folded in, ever

    @property
    def busy(self) -> bool:
        """A capture or a recapture is under way: its lists are not the ones to judge yet."""
        return bool(self.capturing) or self.recapture_pending

    def apply_all(self, events: Iterable[Event]) -> None:
        for ev in events:
            self.apply(ev)

    def apply(self, ev: Event) -> None:
        if isinstance(ev, StepEvent):
            phase = step_phase(ev.phase)
            if phase in self.window:  # steps are rank 0's
                self.window[phase].append(ev)
                self.seen += 1
        elif isinstance(ev, EngineStarted):
            self._started(ev)
        elif isinstance(ev, CaptureStarted) and ev.rank == 0:
            self.capturing.add(ev.phase)
        elif isinstance(ev, CaptureProgress) and ev.rank == 0 and ev.ok:
            self.costs[(ev.phase, ev.bucket)] = BucketCost.of(ev)
        elif isinstance(ev, CaptureFinished) and ev.rank == 0:
            self.capturing.discard(ev.phase)
            if ev.phase in self.current:
                self.current[ev.phase] = tuple(sorted(ev.captured))
        elif isinstance(ev, RecaptureRequested):
            self.recapture_pending = True
        elif isinstance(ev, RecaptureFinished):
            self.recapture_pending = False
            self.current["decode"] = tuple(sorted(ev.decode_bs))
            self.current["prefill"] = tuple(sorted(ev.prefill_num_tokens))
        elif isinstance(ev, KVPoolState) and ev.page_size >= 1:
            self.page_size = ev.page_size

    def _started(self, ev: EngineStarted) -> None:
        config = ev.graph_config if isinstance(ev.graph_config, dict) else {}
        for phase in PHASES:
            body = config.get(phase)
            body = body if isinstance(body, dict) else {}
            sizes = body.get(_KEYS[phase])
            sizes = sorted(b for b in sizes if type(b) is int and b >= 1) if isinstance(sizes, list) else []
            self.current[phase] = tuple(sizes)
            self.max_bucket[phase] = max(sizes) if sizes else None  # the static buffers' size
            if body.get("backend") == "disabled":
                self.disabled.add(phase)
        cap = config.get("prefill", {}).get("max_padding_waste") if isinstance(config.get("prefill"), dict) else None
        self.max_padding_waste = float(cap) if isinstance(cap, (int, float)) and not isinstance(cap, bool) else None

    def steps(self) -> list[StepEvent]:
        return [s for ph in PHASES for s in self.window[ph]]

    def propose(
        self,
        *,
        threshold: float = DEFAULT_THRESHOLD,
        max_memory: Optional[float] = None,
        holdout: float = DEFAULT_HOLDOUT,
        min_steps: int = MIN_STEPS,
    ) -> Optional[Proposal]:
        """The phases whose advice saves at least ``threshold`` of the held-out step cost; None when
        none does (or a capture is under way)."""
        if self.busy:
            return None
        return propose(
            {ph: list(self.window[ph]) for ph in PHASES},
            {ph: self.current[ph] for ph in PHASES if ph not in self.disabled},
            tuple(self.costs.values()),
            max_padding_waste=self.max_padding_waste,
            max_bucket=self.max_bucket,
            page_size=self.page_size,
            threshold=threshold,
            max_memory=max_memory,
            holdout=holdout,
            min_steps=min_steps,
        )


def propose(
    steps: Mapping[str, Sequence[StepEvent]],
    current: Mapping[str, Sequence[int]],
    costs: Sequence[BucketCost],
    *,
    max_padding_waste: Optional[float],
    max_bucket: Mapping[str, Optional[int]],
    page_size: Optional[int] = None,
    threshold: float = DEFAULT_THRESHOLD,
    max_memory: Optional[float] = None,
    holdout: float = DEFAULT_HOLDOUT,
    min_steps: int = MIN_STEPS,
) -> Optional[Proposal]:
    """The proposal for a window of ``steps`` (phase -> steps, in order) and the lists in use
    (``current``: phase -> list; a phase left out, or with no list, is not advised). What
    ``LiveAdvisor.propose`` and the dashboard's live advice both call."""
    found = []
    for phase in PHASES:
        now = tuple(current.get(phase, ()))
        mine = list(steps.get(phase, ()))
        if not now or len(mine) < min_steps:
            continue
        points = cost_points(costs, phase)
        if max_memory is not None and not points:
            continue  # a budget that cannot be checked is not met
        advice, _ = advise_phase(
            mine,
            phase,
            costs=costs,
            max_padding_waste=max_padding_waste,
            current=list(now),
            max_graphs=len(now),
            max_memory=max_memory,
            max_bucket=max_bucket.get(phase),
            holdout=holdout,
            page_size=page_size,
            keep_largest=True,
            keep_current=True,
        )
        held = advice.held_out
        gain = held.gain if held is not None else None
        if gain is None or gain < threshold or not advice.buckets or advice.buckets == now:
            continue
        found.append(
            PhaseProposal(phase, advice.buckets, now, gain, _memory(points, now), advice.memory_bytes, len(mine))
        )
    return Proposal(tuple(found)) if found else None


def _memory(points: dict[int, float], buckets: Iterable[int]) -> Optional[float]:
    """Estimated graph memory of ``buckets`` from the ledger's points; None without any."""
    values = [estimate_cost(points, b) for b in buckets]
    return None if not points or any(v is None for v in values) else float(sum(values))  # type: ignore[arg-type]
