"""What-if for bucket lists: replay the steps seen so far against candidate buckets.

Pure so it can be tested with numbers and reused by the bucket editor on every keystroke. It asks the
engine's own bucket policy (``graphtop.engine.graphs.bucket_policy``) what each recorded step would
do under the candidate lists, and counts the answers with the trace report's counting rules
(``graphtop.engine.trace_tools.stats``), so a prediction is what a recapture then measures:

* a step a bucket list decides (``bucket_policy.depends_on_buckets``: a graph step, or one that fell
  back for a bucket-list reason) is decided again under the candidate lists, with the same prefill
  padding cap; any other step stays eager under any candidate;
* graph memory (and capture time) per bucket comes from the capture ledger, interpolated linearly
  between captured buckets and extrapolated from the nearest two outside them
  (``telemetry.capture.estimate_cost``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from graphtop.engine.graphs.bucket_policy import BucketPolicy, depends_on_buckets
from graphtop.engine.telemetry.capture import BucketCost, cost_points, estimate_cost
from graphtop.engine.telemetry.events import StepEvent
from graphtop.engine.telemetry.step_size import DECODE, PREFILL, step_key, step_phase
from graphtop.engine.trace_tools.stats import HitTally

__all__ = ["PhaseWhatIf", "WhatIf", "WhatIfInputs", "what_if"]


@dataclass(frozen=True)
class WhatIfInputs:
    """What the dashboard has seen that a what-if needs: steps, capture costs, the prefill cap."""

    steps: tuple[StepEvent, ...] = ()
    costs: tuple[BucketCost, ...] = ()
    max_padding_waste: Optional[float] = None  # None: no cap known (no engine_started seen)


@dataclass
class PhaseWhatIf(HitTally):
    """Outcome for one phase's bucket list."""

    phase: str = ""
    graph_count: int = 0
    est_memory_bytes: Optional[float] = None
    est_capture_seconds: Optional[float] = None


@dataclass(frozen=True)
class WhatIf:
    """Both phases together, plus totals the editor shows in its headline."""

    decode: PhaseWhatIf
    prefill: PhaseWhatIf

    @property
    def total(self) -> HitTally:
        return self.decode.merge(self.prefill)

    @property
    def steps(self) -> int:
        return self.total.steps

    @property
    def graph_steps(self) -> int:
        return self.total.graph_steps

    @property
    def hit_rate(self) -> Optional[float]:
        return self.total.hit_rate

    @property
    def padding_waste(self) -> Optional[float]:
        return self.total.padding_waste

    @property
    def graph_count(self) -> int:
        return self.decode.graph_count + self.prefill.graph_count

    @property
    def est_memory_bytes(self) -> Optional[float]:
        return _sum_known(p.est_memory_bytes for p in (self.decode, self.prefill) if p.graph_count)

    @property
    def est_capture_seconds(self) -> Optional[float]:
        return _sum_known(p.est_capture_seconds for p in (self.decode, self.prefill) if p.graph_count)


def _sum_known(parts: Iterable[Optional[float]]) -> Optional[float]:
    parts = list(parts)
    return None if any(p is None for p in parts) else float(sum(parts))  # type: ignore[arg-type]


def _phase(
    phase: str,
    steps: Sequence[StepEvent],
    candidate: BucketPolicy,
    current: Optional[BucketPolicy],
    costs: Sequence[BucketCost],
) -> PhaseWhatIf:
    out = PhaseWhatIf(phase=phase, graph_count=len(candidate.buckets))
    for s in steps:
        size = step_key(s.phase, s.batch_size, s.num_tokens)
        if not depends_on_buckets(s.path == "graph", s.fallback_reason, size, current):
            out.add(False)
            continue
        d = candidate.decide(size)
        out.add(d.graph, d.bucket, d.padded)
    mem_points, sec_points = cost_points(costs, phase, "memory_bytes"), cost_points(costs, phase, "seconds")
    out.est_memory_bytes = _sum_known(estimate_cost(mem_points, b) for b in candidate.buckets)
    out.est_capture_seconds = _sum_known(estimate_cost(sec_points, b) for b in candidate.buckets)
    return out


def what_if(
    steps: Iterable[StepEvent],
    decode_buckets: Sequence[int],
    prefill_buckets: Sequence[int],
    costs: Iterable[BucketCost] = (),
    *,
    max_padding_waste: Optional[float] = None,
    current_decode: Optional[Sequence[int]] = None,
    current_prefill: Optional[Sequence[int]] = None,
) -> WhatIf:
    """Model graph hit rate, padding waste, graph count and graph memory for candidate buckets.

    ``max_padding_waste`` is the engine's prefill padding cap (``EngineStarted.graph_config``); the
    current bucket lists only matter for steps whose fallback reason is unknown (see the module).
    """
    steps = list(steps)
    costs = list(costs)

    def policy(phase: str, buckets: Optional[Sequence[int]]) -> Optional[BucketPolicy]:
        if buckets is None:
            return None
        return BucketPolicy.of(phase, buckets, max_padding_waste=max_padding_waste if phase == PREFILL else None)

    phases = {}
    for phase, cand, cur in ((DECODE, decode_buckets, current_decode), (PREFILL, prefill_buckets, current_prefill)):
        mine = [s for s in steps if step_phase(s.phase) == phase]
        candidate = policy(phase, cand)
        assert candidate is not None
        phases[phase] = _phase(phase, mine, candidate, policy(phase, cur), costs)
    return WhatIf(decode=phases[DECODE], prefill=phases[PREFILL])
