"""The tallies every reader of the event stream counts steps and parity checks with (the live fold,
the trace summary, the dashboard, the what-if): one definition of a hit, of padding and of a parity
failure. The rules themselves are written down in ``trace_tools.stats``, which re-exports these; they
live here, in the live package, because the fold (``fold``) runs while the engine serves and the live
telemetry never imports the offline trace tools. Pure data and arithmetic: no torch, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

__all__ = ["BucketTally", "HitTally", "ParityTally"]


@dataclass
class HitTally:
    """Steps of one kind, how many replayed a graph, and the padding those graphs carried."""

    steps: int = 0
    graph_steps: int = 0
    padded_tokens: int = 0  # graph steps with a bucket only
    bucket_tokens: int = 0  # sum of the buckets replayed

    def add(self, graph: bool, bucket: Optional[int] = None, padded: int = 0) -> None:
        self.steps += 1
        if graph:
            self.graph_steps += 1
            if bucket is not None:
                self.padded_tokens += padded
                self.bucket_tokens += bucket

    def merge(self, other: "HitTally") -> "HitTally":
        """A new tally counting both."""
        return HitTally(
            self.steps + other.steps,
            self.graph_steps + other.graph_steps,
            self.padded_tokens + other.padded_tokens,
            self.bucket_tokens + other.bucket_tokens,
        )

    @property
    def eager_steps(self) -> int:
        return self.steps - self.graph_steps

    @property
    def hit_rate(self) -> Optional[float]:
        """None without steps: "no data" is not "no hits"."""
        return self.graph_steps / self.steps if self.steps else None

    @property
    def padding_waste(self) -> Optional[float]:
        return self.padded_tokens / self.bucket_tokens if self.bucket_tokens else None


@dataclass
class BucketTally:
    """Graph steps that replayed one bucket."""

    bucket: int
    count: int = 0
    padded_tokens: int = 0
    waste_sum: float = 0.0  # sum of per-step padding_waste, for the mean

    def add(self, padded: int, padding_waste: float) -> None:
        self.count += 1
        self.padded_tokens += padded
        self.waste_sum += padding_waste

    @property
    def bucket_tokens(self) -> int:
        return self.count * self.bucket

    @property
    def waste(self) -> float:
        """Padded tokens over bucket tokens (the same definition as ``HitTally.padding_waste``)."""
        return self.padded_tokens / self.bucket_tokens if self.bucket_tokens else 0.0

    @property
    def mean_waste(self) -> float:
        return self.waste_sum / self.count if self.count else 0.0


class ParityCheckLike(Protocol):
    max_rel_err: float
    max_abs_err: float
    argmax_agree: float
    top5_overlap: float
    mismatch: bool
    skipped: int
    discarded: int
    every: int
    tolerance: float


class ParityNotRunLike(Protocol):
    skipped: int
    discarded: int
    every: int


@dataclass
class ParityTally:
    """Parity checks seen so far."""

    checks: int = 0
    mismatches: int = 0
    worst_rel_err: Optional[float] = None
    worst_abs_err: Optional[float] = None
    min_argmax_agree: Optional[float] = None
    min_top5_overlap: Optional[float] = None
    skipped: int = 0  # due checks not run (the previous one still running, or a step too large)
    discarded: int = 0  # checks whose requests' KV was freed mid-check (inconclusive)
    every: int = 0  # the last rate seen (one graph step in N)
    tolerance: Optional[float] = None

    def add(self, ev: ParityCheckLike) -> None:
        """Count one ``parity_check`` event (any object with its fields)."""
        self.checks += 1
        self.mismatches += int(ev.mismatch)
        self.worst_rel_err = _worst(self.worst_rel_err, ev.max_rel_err, max)
        self.worst_abs_err = _worst(self.worst_abs_err, ev.max_abs_err, max)
        self.min_argmax_agree = _worst(self.min_argmax_agree, ev.argmax_agree, min)
        self.min_top5_overlap = _worst(self.min_top5_overlap, ev.top5_overlap, min)
        self.skipped, self.discarded, self.every, self.tolerance = ev.skipped, ev.discarded, ev.every, ev.tolerance

    def not_run(self, ev: ParityNotRunLike) -> None:
        """Take the counts of one ``parity_not_run`` event (a due check that compared nothing)."""
        self.skipped, self.discarded, self.every = ev.skipped, ev.discarded, ev.every

    @property
    def failing(self) -> bool:
        """Any mismatch: the dashboard's red state."""
        return self.mismatches > 0


def _worst(old: Optional[float], new: float, pick) -> float:  # type: ignore[no-untyped-def]
    return new if old is None else pick(old, new)
