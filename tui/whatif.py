"""What-if for bucket lists: replay the steps seen so far against candidate buckets.

Pure so it can be tested with numbers and reused by the bucket editor on every keystroke. The
model is deliberately simple and explainable:

* a decode step needs the smallest decode bucket ≥ its batch size; a prefill (or mixed) step the
  smallest prefill bucket ≥ its token count; with none it runs eager;
* a step that ran eager although it fitted the *current* buckets fell back for another reason
  (capture failed, unsupported feature, …) and stays eager under any candidate;
* padding waste is padded slots over bucket slots for the steps that hit a graph;
* graph memory (and capture time) per bucket comes from the capture ledger, interpolated linearly
  between captured buckets and extrapolated from the nearest two outside them.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Mapping, Optional, Sequence

if TYPE_CHECKING:  # typing only: importing the engine package pulls in torch
    from graphtop.engine.telemetry.events import StepEvent

DECODE = "decode"
PREFILL = "prefill"


@dataclass(frozen=True)
class BucketCost:
    """What capturing one bucket cost (mirrors the engine's BucketCapture / CaptureProgress)."""

    phase: str
    bucket: int
    seconds: float
    memory_bytes: int
    ok: bool = True


@dataclass(frozen=True)
class PhaseWhatIf:
    """Outcome for one phase's bucket list."""

    phase: str
    steps: int
    graph_steps: int
    padded_slots: int
    bucket_slots: int
    graph_count: int
    est_memory_bytes: Optional[float]
    est_capture_seconds: Optional[float]

    @property
    def hit_rate(self) -> Optional[float]:
        return self.graph_steps / self.steps if self.steps else None

    @property
    def padding_waste(self) -> Optional[float]:
        return self.padded_slots / self.bucket_slots if self.bucket_slots else None


@dataclass(frozen=True)
class WhatIf:
    """Both phases together, plus totals the editor shows in its headline."""

    decode: PhaseWhatIf
    prefill: PhaseWhatIf

    @property
    def steps(self) -> int:
        return self.decode.steps + self.prefill.steps

    @property
    def graph_steps(self) -> int:
        return self.decode.graph_steps + self.prefill.graph_steps

    @property
    def hit_rate(self) -> Optional[float]:
        return self.graph_steps / self.steps if self.steps else None

    @property
    def padding_waste(self) -> Optional[float]:
        slots = self.decode.bucket_slots + self.prefill.bucket_slots
        padded = self.decode.padded_slots + self.prefill.padded_slots
        return padded / slots if slots else None

    @property
    def graph_count(self) -> int:
        return self.decode.graph_count + self.prefill.graph_count

    @property
    def est_memory_bytes(self) -> Optional[float]:
        parts = [p.est_memory_bytes for p in (self.decode, self.prefill) if p.graph_count]
        if any(p is None for p in parts):
            return None
        return float(sum(parts))  # type: ignore[arg-type]

    @property
    def est_capture_seconds(self) -> Optional[float]:
        parts = [p.est_capture_seconds for p in (self.decode, self.prefill) if p.graph_count]
        if any(p is None for p in parts):
            return None
        return float(sum(parts))  # type: ignore[arg-type]


def step_phase(step: StepEvent) -> str:
    """Which bucket list a step is looked up in (mixed steps go through the prefill graphs)."""
    return DECODE if step.phase == DECODE else PREFILL


def step_key(step: StepEvent) -> int:
    """The size a step is bucketed by: batch size for decode, token count otherwise."""
    return step.batch_size if step_phase(step) == DECODE else step.num_tokens


def pick_bucket(sorted_buckets: Sequence[int], size: int) -> Optional[int]:
    """Smallest bucket ≥ size, or None when the step is larger than every bucket."""
    i = bisect.bisect_left(sorted_buckets, size)
    return sorted_buckets[i] if i < len(sorted_buckets) else None


def estimate(points: Mapping[int, float], bucket: int) -> Optional[float]:
    """Per-bucket cost at ``bucket`` from measured ``points`` (bucket → value).

    Exact where measured; linear between neighbours; outside the measured range, the slope of the
    nearest two points (clamped at ≥ 0); a single point is used as a constant. None without data.
    """
    if not points:
        return None
    if bucket in points:
        return float(points[bucket])
    xs = sorted(points)
    if len(xs) == 1:
        return float(points[xs[0]])
    i = bisect.bisect_left(xs, bucket)
    if i == 0:
        x0, x1 = xs[0], xs[1]
    elif i == len(xs):
        x0, x1 = xs[-2], xs[-1]
    else:
        x0, x1 = xs[i - 1], xs[i]
    y0, y1 = float(points[x0]), float(points[x1])
    value = y0 + (y1 - y0) * (bucket - x0) / (x1 - x0)
    return max(value, 0.0)


def _phase(
    phase: str,
    steps: Sequence[StepEvent],
    candidate: Sequence[int],
    current: Optional[Sequence[int]],
    costs: Sequence[BucketCost],
) -> PhaseWhatIf:
    cand = sorted(set(candidate))
    cur = sorted(set(current)) if current is not None else None
    graph = padded = slots = 0
    for s in steps:
        size = step_key(s)
        if s.path != "graph" and cur is not None and pick_bucket(cur, size) is not None:
            continue  # fell back for a reason buckets cannot fix
        b = pick_bucket(cand, size)
        if b is None:
            continue
        graph += 1
        padded += b - size
        slots += b
    ok = [c for c in costs if c.phase == phase and c.ok]
    mem_points = {c.bucket: float(c.memory_bytes) for c in ok}
    sec_points = {c.bucket: float(c.seconds) for c in ok}
    mem: Optional[float] = 0.0
    sec: Optional[float] = 0.0
    for b in cand:
        m, t = estimate(mem_points, b), estimate(sec_points, b)
        mem = None if mem is None or m is None else mem + m
        sec = None if sec is None or t is None else sec + t
    return PhaseWhatIf(phase, len(steps), graph, padded, slots, len(cand), mem, sec)


def what_if(
    steps: Iterable[StepEvent],
    decode_buckets: Sequence[int],
    prefill_buckets: Sequence[int],
    costs: Iterable[BucketCost] = (),
    *,
    current_decode: Optional[Sequence[int]] = None,
    current_prefill: Optional[Sequence[int]] = None,
) -> WhatIf:
    """Model graph hit rate, padding waste, graph count and graph memory for candidate buckets.

    Pass the current bucket lists so steps that fell back for non-size reasons stay eager; without
    them every step is judged by size alone.
    """
    steps = list(steps)
    costs = list(costs)
    dec = [s for s in steps if step_phase(s) == DECODE]
    pre = [s for s in steps if step_phase(s) == PREFILL]
    return WhatIf(
        decode=_phase(DECODE, dec, decode_buckets, current_decode, costs),
        prefill=_phase(PREFILL, pre, prefill_buckets, current_prefill, costs),
    )
