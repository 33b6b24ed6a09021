"""The fold's facts about forward steps: hits and padding by phase and bucket, eager fallbacks and why,
recent steps and their timings. ``fold.RunFold`` feeds it; the dashboard, the trace summary and the
metrics read it, so a graph step counted in one is counted in all.

Buckets are kept two ways because two questions are asked: ``phases[p].buckets`` counts the whole
run (the summary's table, the metrics' counters), ``in_use`` only the hits on the graphs in use now
(a capture pass of a phase replaces its graphs, and the dashboard's histogram starts again).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from .events import StepEvent
from .history import History, KeyedSamples, Samples
from .measured import finite_step
from .step_size import step_phase
from .tallies import BucketTally, HitTally

__all__ = ["PhaseTally", "StepFacts"]


@dataclass
class PhaseTally(HitTally):
    """Steps of one phase (decode | prefill | mixed) over the whole run, and their buckets' hits
    (decode buckets are batch sizes, prefill buckets token counts: never mixed)."""

    phase: str = field(default="", kw_only=True)
    tokens: int = 0
    buckets: dict[int, BucketTally] = field(default_factory=dict)


class _Phase:
    """One phase's tally and timings, looked up once per step."""

    __slots__ = ("tally", "bucket_list", "replay", "host")

    def __init__(self, phase: str, replay: Samples, host: Samples) -> None:
        self.tally = PhaseTally(phase=phase)
        self.bucket_list = step_phase(phase)  # the phase whose bucket list its steps are looked up in
        self.replay = replay
        self.host = host


class StepFacts:
    """Every step event folded. Timings are measurements only (``measured.finite_step``): a step
    from an attached engine that sent NaN counts, its bad timing does not. Folded on every reader's
    thread for every step, so ``add`` is written for speed: one lookup of the step's phase."""

    def __init__(self, recent: Optional[int], samples: Optional[int], numbers: bool, tallies: bool = True) -> None:
        self.tallies = tallies  # False: only ``recent`` is kept (the state keeper: see its docstring)
        self.phases: dict[str, PhaseTally] = {}
        self._phases: dict[str, _Phase] = {}
        self.in_use: dict[tuple[str, int], BucketTally] = {}  # (bucket list's phase, bucket) since its capture
        self.fallbacks: dict[tuple[str, Optional[str]], int] = {}  # (phase, reason or None) -> eager steps
        self.last_fallback: Optional[str] = None  # the reason of the latest eager step
        self.emulated = 0  # steps run on emulated graphs
        self.recent: History[StepEvent] = History(recent)
        self.replay_ms = Samples(samples)  # graph steps of every phase, in order
        self.replay_by_phase: KeyedSamples[str] = KeyedSamples(samples)
        self.host_by_phase: KeyedSamples[str] = KeyedSamples(samples)
        self.numbers: Optional[set[int]] = set() if numbers else None  # for gaps; None: not tracked

    @property
    def hits(self) -> HitTally:
        """Every step of every phase."""
        total = HitTally()
        for tally in self.phases.values():
            total = total.merge(tally)
        return total

    def add(self, seq: int, ev: StepEvent) -> bool:
        """Fold one step; True when the latest fallback reason changed (the capture panel says it)."""
        ev = finite_step(ev)
        self.recent.add(seq, ev)
        if not self.tallies:
            return False
        phase = ev.phase
        p = self._phases.get(phase)
        if p is None:
            p = self._phases[phase] = _Phase(phase, self.replay_by_phase.get(phase), self.host_by_phase.get(phase))
            self.phases[phase] = p.tally
        tally = p.tally
        bucket, padded = ev.bucket, ev.padded
        graph = ev.path == "graph"
        tally.add(graph, bucket, padded)
        tally.tokens += ev.num_tokens
        p.host.add(ev.host_ms)
        if ev.emulated:
            self.emulated += 1
        if self.numbers is not None:
            self.numbers.add(ev.step)
        if graph:
            replay = ev.replay_ms
            if replay is not None:
                self.replay_ms.add(replay)
                p.replay.add(replay)
            if bucket is not None:
                waste = ev.padding_waste
                b = tally.buckets.get(bucket)
                if b is None:
                    b = tally.buckets[bucket] = BucketTally(bucket)
                b.add(padded, waste)
                key = (p.bucket_list, bucket)
                b = self.in_use.get(key)
                if b is None:
                    b = self.in_use[key] = BucketTally(bucket)
                b.add(padded, waste)
            return False
        key = (phase, ev.fallback_reason or None)
        self.fallbacks[key] = self.fallbacks.get(key, 0) + 1
        if ev.fallback_reason != self.last_fallback:
            self.last_fallback = ev.fallback_reason
            return True
        return False

    def capture_started(self, phase: str) -> None:
        """A capture pass of ``phase`` replaces its graphs: their hits no longer describe the graphs in
        use (hits while the pass captures are on its own buckets, and stay)."""
        self.in_use = {k: v for k, v in self.in_use.items() if k[0] != phase}

    def fallback_reasons(self, unspecified: str) -> Counter[str]:
        """Eager steps by reason over every phase; a step that gave none counts as ``unspecified``."""
        out: Counter[str] = Counter()
        for (_, reason), n in self.fallbacks.items():
            out[reason or unspecified] += n
        return out

    @property
    def missing(self) -> int:
        """Gaps in the step numbers seen (events the recorder dropped, most likely); 0 untracked."""
        if not self.numbers:
            return 0
        return (max(self.numbers) - min(self.numbers) + 1) - len(self.numbers)
