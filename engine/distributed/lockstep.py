"""Model runners that capture and serve in step with the other ranks of a tensor-parallel group.

Every rank runs the same model-runner calls in the same order (rank 0 sends its workers each call it
makes): a forward, a capture, a capture slice. Two things a lone runner decides from local facts
must be decided the same way everywhere, because captured graphs and eager steps contain collectives
that pair up across ranks:

- how much of a pending capture a step boundary captures: one bucket per phase, not a time budget
  (the ranks' clocks differ);
- which captured buckets a phase keeps: those every rank captured (a bucket that failed on one rank
  runs eagerly on all of them, ``capture_failed``; that rank's ``capture_progress`` names it).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, TypeVar

from ..batch import ForwardBatch
from ..errors import TensorParallelError
from ..graphs.model_runner import CaptureSlice, ModelRunner
from ..graphs.runners.base import StepOutput
from ..graphs.runners.bucketed import BucketedGraphRunner
from .process_group import RankGroup
from .wire import ForwardEncoder, encode_control

T = TypeVar("T")


class LockstepModelRunner(ModelRunner):
    def __init__(self, *args: Any, group: RankGroup, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group = group
        for runner in self._runners():
            runner.agree_buckets = _agreement(group, runner)  # type: ignore[method-assign]

    def capture_slice(self, to_the_end: bool) -> CaptureSlice:
        """One bucket per phase and step boundary, on every rank alike (not a time budget)."""
        return CaptureSlice() if to_the_end else CaptureSlice(max_buckets=1)


def _agreement(group: RankGroup, runner: BucketedGraphRunner) -> Callable[[list[int]], list[int]]:
    def agree(replayable: list[int]) -> list[int]:
        configured = runner.configured
        kept = group.agree_min([1 if b in replayable else 0 for b in configured])
        return [b for b, k in zip(configured, kept) if k]

    return agree


class Link(Protocol):
    """Rank 0's line to its workers (``TensorParallelGroup``)."""

    in_call: bool  # a mirrored call is under way: failing now leaves the ranks out of step

    def send(self, message: Any) -> None: ...


class MirroredModelRunner(LockstepModelRunner):
    """Rank 0's runner: each call that runs the model goes to the workers first, then runs here; the
    workers make the same call on their shards (engine/distributed/worker.py). ``link.in_call`` is set
    from the send until the call returns, so a failure in between is known to have left the ranks'
    collectives out of step, and one outside it (sampling, output processing) is not."""

    def __init__(self, *args: Any, link: Link, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.link = link
        self.encoder = ForwardEncoder()
        self.forward_seq = 0
        self._inside_recapture = False

    def _mirrored(self, message: Any, call: Callable[..., T], *args: Any) -> T:
        self.link.in_call = True
        self.link.send(message)
        result = call(*args)
        self.link.in_call = False
        return result

    def start_capture(self) -> None:
        self._mirrored(encode_control("start_capture"), super().start_capture)

    def recapture(self, decode_bs: Any, prefill_tokens: Any) -> None:
        self._inside_recapture = True  # its first slice is part of the call the workers mirror
        try:
            self._mirrored(
                encode_control("recapture", decode_bs, prefill_tokens), super().recapture, decode_bs, prefill_tokens
            )
        finally:
            self._inside_recapture = False

    def advance_capture(self, *, to_the_end: bool = False, ride: bool = False, idle: bool = False) -> bool:
        """Every rank captures the same slice (whole buckets, both kinds of stage, with nothing in flight):
        recordings never ride an in-flight step here (``record_in_flight`` stays off)."""
        if ride:
            return False
        if self.capture_pending and not self._inside_recapture:
            return self._mirrored(
                encode_control("advance_capture", to_the_end),
                lambda: super(MirroredModelRunner, self).advance_capture(to_the_end=to_the_end),
            )
        return super().advance_capture(to_the_end=to_the_end)

    def forward(self, batch: ForwardBatch) -> StepOutput:
        self.forward_seq += 1
        return self._mirrored(self.encoder.encode(batch, self.forward_seq), super().forward, batch)

    def release(self) -> None:
        try:
            self.link.send(encode_control("release"))
        except TensorParallelError:  # a dead group: only rank 0's own graphs are left to drop
            pass
        super().release()
