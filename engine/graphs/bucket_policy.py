"""Which captured graph a step replays, or the named reason it runs eagerly: the one bucket policy.

The graph runners call it on every step and the dashboard's what-if calls it to replay recorded steps
against a candidate bucket list, so a prediction follows exactly the rules the engine applies:

* a step takes the smallest captured bucket >= its size (requests for decode, tokens for prefill);
* a step larger than the largest captured bucket runs eagerly (``exceeds_max_bucket`` /
  ``prefill_tokens_over_max_bucket``), unless a larger bucket was asked for and failed to capture
  (``capture_failed``);
* a prefill step whose padding would exceed the cap (``max_padding_waste``, a fraction of the bucket)
  runs eagerly (``prefill_padding_over_cap``): a big pad costs more than the eager step saves;
* while a capture runs, a step is decided against the list being captured, and runs eagerly
  (``not_yet_captured``, or ``recapture_in_progress`` for a recapture) when the bucket that list gives
  it is not captured yet: a step never borrows a larger bucket that happens to be captured first, so
  each step replays exactly the bucket it will replay once capture is done, with the same padding.

Pure (no torch), so the dashboard can import it without loading the inference stack.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace
from typing import Optional, Sequence

from .fallback import FallbackReason

__all__ = [
    "BUCKET_REASONS",
    "DEMAND_REASONS",
    "TRANSIENT_REASONS",
    "BucketDecision",
    "BucketPolicy",
    "bucket_could_serve",
    "depends_on_buckets",
    "pick_bucket",
    "pick_graph_width",
    "within_padding_cap",
]

#: The eager reasons a different bucket list can change; every other reason does not depend on it.
BUCKET_REASONS = frozenset(
    {
        FallbackReason.EXCEEDS_MAX_BUCKET,
        FallbackReason.PREFILL_TOKENS_OVER_MAX_BUCKET,
        FallbackReason.PREFILL_PADDING_OVER_CAP,
    }
)


#: Eager only while graphs are being captured: once the list in use is captured, the same size is
#: decided by it, so a what-if and the advisor decide these steps again under any candidate list.
TRANSIENT_REASONS = frozenset(
    {
        FallbackReason.NOT_YET_CAPTURED,
        FallbackReason.KERNELS_COMPILING,
        FallbackReason.RECAPTURE_IN_PROGRESS,
    }
)

#: Every eager reason whose step a captured bucket could have served: the advisor's demand. A failed
#: capture stays eager in a what-if (the same capture would likely fail again), but the size was
#: still asked for, so the advice must weigh it; only a context wider than the graph's page table,
#: a phase without graphs, or a device without them are beyond any bucket.
DEMAND_REASONS = (
    BUCKET_REASONS | TRANSIENT_REASONS | frozenset({FallbackReason.CAPTURE_FAILED, FallbackReason.NO_GRAPHS_CAPTURED})
)

_KNOWN_REASONS = frozenset(r.value for r in FallbackReason)
_BUCKET_REASON_VALUES = frozenset(r.value for r in BUCKET_REASONS | TRANSIENT_REASONS)
_DEMAND_REASON_VALUES = frozenset(r.value for r in DEMAND_REASONS)


def pick_bucket(buckets: Sequence[int], size: int) -> Optional[int]:
    """Smallest of ``buckets`` (ascending) >= ``size``; None when ``size`` is larger than all of them."""
    i = bisect.bisect_left(buckets, size)
    return buckets[i] if i < len(buckets) else None


def within_padding_cap(bucket: int, size: int, max_padding_waste: Optional[float]) -> bool:
    """May a step of ``size`` pad up to ``bucket``? The prefill cap's rule (padding as a fraction of
    the bucket), shared by ``BucketPolicy.decide`` and the bucket advisor so both judge alike."""
    return max_padding_waste is None or (bucket - size) / bucket <= max_padding_waste


def depends_on_buckets(graph: bool, reason: Optional[str], size: int, current: Optional["BucketPolicy"]) -> bool:
    """Would a different bucket list change how a recorded step ran?

    A graph step, or an eager one whose named reason is a bucket-list reason (larger than the largest
    bucket, prefill padding over the cap) or a capture still under way (``TRANSIENT_REASONS``: once
    captured, the list decides that size), is decided again under another list. Any other named
    reason (capture failed, context wider than the graph, ...) stays eager under every list. A step
    whose reason is unknown (a hand-made or older trace) counts as decided by the list when the
    ``current`` lists, if given, refuse it by size.
    """
    if graph:
        return True
    if reason in _KNOWN_REASONS:
        return reason in _BUCKET_REASON_VALUES
    return current is None or current.decide(size).reason in BUCKET_REASONS


def bucket_could_serve(graph: bool, reason: Optional[str], size: int, current: Optional["BucketPolicy"]) -> bool:
    """Is a recorded step demand for a bucket (the advisor's question)? Every step that
    ``depends_on_buckets``, and also one whose bucket failed to capture or that found no graphs at
    all: its size was needed, whatever became of the capture (``DEMAND_REASONS``)."""
    if reason in _DEMAND_REASON_VALUES and not graph:
        return True
    return depends_on_buckets(graph, reason, size, current)


@dataclass(frozen=True)
class BucketDecision:
    """A graph bucket and its padding, or the reason the step runs eagerly."""

    bucket: Optional[int] = None
    padded: int = 0
    reason: Optional[FallbackReason] = None

    @property
    def graph(self) -> bool:
        return self.reason is None


@dataclass(frozen=True)
class BucketPolicy:
    """The buckets of one phase and the rules that pick among them."""

    phase: str  # decode | prefill
    buckets: tuple[int, ...]  # captured and replayable, ascending
    configured: tuple[int, ...] = ()  # asked for, ascending; those not in ``buckets`` failed to capture
    max_padding_waste: Optional[float] = None  # prefill: refuse a bucket padded beyond this fraction
    pending: tuple[int, ...] = ()  # asked for and not attempted yet: a capture is running
    pending_reason: FallbackReason = FallbackReason.NOT_YET_CAPTURED

    @classmethod
    def of(
        cls,
        phase: str,
        buckets: Sequence[int],
        configured: Sequence[int] = (),
        max_padding_waste: Optional[float] = None,
        pending: Sequence[int] = (),
        pending_reason: FallbackReason = FallbackReason.NOT_YET_CAPTURED,
    ) -> "BucketPolicy":
        return cls(
            phase,
            tuple(sorted(set(buckets))),
            tuple(sorted(set(configured))),
            max_padding_waste,
            tuple(sorted(set(pending))),
            pending_reason,
        )

    @property
    def over_max_reason(self) -> FallbackReason:
        if self.phase == "decode":
            return FallbackReason.EXCEEDS_MAX_BUCKET
        return FallbackReason.PREFILL_TOKENS_OVER_MAX_BUCKET

    def pick(self, size: int) -> Optional[int]:
        return pick_bucket(self.buckets, size)

    def decide(self, size: int) -> BucketDecision:
        if self.pending:  # decide as the finished capture will, then see whether that bucket is live yet
            done = replace(self, buckets=tuple(sorted(set(self.buckets) | set(self.pending))), pending=())
            decision = done.decide(size)
            if decision.graph and decision.bucket in self.pending:
                return BucketDecision(reason=self.pending_reason)
            return decision
        if not self.buckets:
            return BucketDecision(
                reason=FallbackReason.CAPTURE_FAILED if self.configured else FallbackReason.NO_GRAPHS_CAPTURED
            )
        if size > self.buckets[-1]:
            if self.configured and size <= self.configured[-1]:
                return BucketDecision(reason=FallbackReason.CAPTURE_FAILED)
            return BucketDecision(reason=self.over_max_reason)
        bucket = self.pick(size)
        assert bucket is not None
        if not within_padding_cap(bucket, size, self.max_padding_waste):
            return BucketDecision(reason=FallbackReason.PREFILL_PADDING_OVER_CAP)
        return BucketDecision(bucket, bucket - size)


def pick_graph_width(widths: list[int], pages: int) -> int:
    """The narrowest of a backend's ``graph_widths`` holding ``pages`` pages (0 where it has one graph
    per bucket); the caller has checked that the widest holds them."""
    fits = [w for w in widths if w == 0 or w >= pages]
    return min(fits) if fits else max(widths)
