"""Routes each batch to a graph runner or the eager runner, and owns graph (re)capture.

Graphs are a fast path, never the only path: a batch a graph cannot take runs eagerly and the step
record carries the named ``FallbackReason``. A step's bucket is decided once (``decide``) and that
decision is what the graph runner replays. Capture, the first one and every recapture, runs in
slices between steps (``advance_capture``), a stage at a time, and each bucket serves the moment it is
captured. With ``record_in_flight`` a graph's recording (a RECORD stage, runners/capture.py) waits for
the next step's launch and runs while that step is on the device (``advance_capture(ride=True)``): only
the stages that execute the model (warmup forwards) still run with nothing in flight. The
model runner is built from parts (model, attention, resolved graph config, a ``publish`` callable)
and answers with results; it knows nothing of the engine that composes it.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Callable, NamedTuple, Optional, Sequence

import torch

from ..batch import ForwardBatch, ForwardMode
from ..telemetry import events as ev
from ..telemetry.capture import BucketCost
from .bucket_list import STATIC_BUFFERS_MAXIMUM, BucketList, BucketSpecError
from .bucket_policy import BucketDecision
from .config import ResolvedGraphConfig
from .factory import graph_backend
from .fallback import FallbackReason
from .runners.base import StepOutput
from .runners.bucketed import BucketedGraphRunner
from .runners.capture import ANY_STAGE, StageKind
from .runners.decode_graph import DecodeGraphRunner
from .runners.eager import EagerRunner
from .runners.kernel_gate import Precompile
from .runners.prefill_graph import PrefillGraphRunner

if TYPE_CHECKING:  # annotations only: the caller hands the runner its attention backend
    from ..attention.base import AttentionBackend

PublishFn = Callable[[ev.Event], None]

RECAPTURE_SLICE_S = 0.01
"""Capture time one step boundary may spend, shared by the runners in turn: stages until it has passed, at
least one. A stage is a bucket's warmup forward or one graph's recording, tens of milliseconds for an 8B
model on a GPU, so there a step waits for one stage at most (docs/benchmarks.md has the step host times
while capturing); an emulated stage records addresses in microseconds."""


class CaptureSlice(NamedTuple):
    """How much one ``advance_capture`` between two steps may capture: a time budget (None: no limit; 0:
    only what needs no wait for kernels) or whole buckets; ``by_stage``: the budget may end a bucket's
    capture between two stages (its warmup forward, one graph's recording), and the runners spend one
    budget in turn instead of each its own. None everywhere: everything."""

    budget_s: Optional[float] = None
    max_buckets: Optional[int] = None
    by_stage: bool = False
    kinds: frozenset[StageKind] = ANY_STAGE


RUN_ONLY = frozenset({StageKind.RUN})
RECORD_ONLY = frozenset({StageKind.RECORD})


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        attention: AttentionBackend,
        device: torch.device,
        resolved: ResolvedGraphConfig,
        max_pages: int,
        publish: PublishFn,
        *,
        freeze_gc: bool = False,
        precompile: Optional[Precompile] = None,
        record_in_flight: bool = False,
    ):
        """``max_pages``: pages of the longest context a decode graph must cover; ``precompile``: worker
        processes that compile each bucket's kernels before it is captured (None: capture compiles);
        ``record_in_flight``: recordings run while a step is on the device (``GraphConfig``)."""
        self.resolved = resolved
        self.record_in_flight = record_in_flight
        self.publish = publish
        self.emulated = resolved.emulated
        self.eager = EagerRunner(model, attention, device)
        self.decode: Optional[DecodeGraphRunner] = None
        self.prefill: Optional[PrefillGraphRunner] = None
        r = resolved
        if r.available and r.decode_backend != "disabled" and r.decode_bs:
            backend = graph_backend("full", device, emulated=r.emulated, freeze_gc=freeze_gc)
            self.decode = DecodeGraphRunner(model, attention, backend, device, max(r.decode_bs), max_pages, publish)
        if r.available and r.prefill_backend != "disabled" and r.prefill_num_tokens:
            backend = graph_backend("breakable", device, emulated=r.emulated, freeze_gc=freeze_gc)
            self.prefill = PrefillGraphRunner(
                model, attention, backend, device, max(r.prefill_num_tokens), r.prefill_max_padding_waste, publish
            )
        self.compiler = precompile.compiler if precompile is not None else None
        """The process's kernel compiler (its stats: benchmarks), or None where capture compiles."""
        if precompile is not None:
            for runner, buckets in ((self.decode, r.decode_bs), (self.prefill, r.prefill_num_tokens)):
                if runner is not None:
                    runner.gate = precompile.gate(runner.phase, list(buckets), runner.dry_run)
        self._slice_turn = 0  # the runner that starts the next shared slice
        self._recapture_started: Optional[float] = None
        self._recapture_memory_before = 0
        self._capture_waiters: list[threading.Event] = []

    def _label(self, runner: Optional[BucketedGraphRunner]) -> str:
        if runner is None:
            return "disabled" if self.resolved.available else "off (no CUDA graphs)"
        return runner.backend.name

    @property
    def decode_backend_label(self) -> str:
        return self._label(self.decode)

    @property
    def prefill_backend_label(self) -> str:
        return self._label(self.prefill)

    @property
    def decode_buckets(self) -> list[int]:
        return list(self.decode.buckets) if self.decode else []

    @property
    def prefill_buckets(self) -> list[int]:
        return list(self.prefill.buckets) if self.prefill else []

    def _runners(self) -> list[BucketedGraphRunner]:
        return [r for r in (self.decode, self.prefill) if r is not None]

    def graph_memory(self) -> tuple[int, int]:
        return (
            self.decode.memory_bytes() if self.decode else 0,
            self.prefill.memory_bytes() if self.prefill else 0,
        )

    def capture_ledger(self) -> list[BucketCost]:
        out: list[BucketCost] = []
        for runner in self._runners():
            out.extend(sorted(runner.ledger.values(), key=lambda c: c.bucket))
        return out

    # --- capture -------------------------------------------------------------------------------
    def start_capture(self) -> None:
        """Begin capturing the configured lists; ``advance_capture`` does the work, between steps (or
        all at once, for an engine that captures before serving)."""
        for runner, buckets in (
            (self.decode, self.resolved.decode_bs),
            (self.prefill, self.resolved.prefill_num_tokens),
        ):
            if runner is not None:
                runner.start_capture(buckets, "initial")

    def validate_buckets(self, phase: str, sizes: Sequence[int]) -> list[int]:
        runner = self.decode if phase == "decode" else self.prefill
        if runner is None:
            raise BucketSpecError(f"{phase} graphs are disabled; nothing to recapture")
        try:
            return BucketList(sizes, maximum=runner.max_size, maximum_label=STATIC_BUFFERS_MAXIMUM).as_list()
        except BucketSpecError as e:
            raise BucketSpecError(f"{phase} buckets: {e}", e.token) from None

    def recapture(self, decode_bs: Optional[Sequence[int]], prefill_tokens: Optional[Sequence[int]]) -> None:
        """Validate, release the old graphs, and start capturing; the rest happens between steps
        (``advance_capture``). A bad list is answered with a failed ``recapture_finished``."""
        try:
            lists = {}
            if decode_bs is not None:
                lists["decode"] = self.validate_buckets("decode", decode_bs)
            if prefill_tokens is not None:
                lists["prefill"] = self.validate_buckets("prefill", prefill_tokens)
            if not lists:
                raise BucketSpecError("recapture needs a decode or a prefill bucket list")
        except BucketSpecError as e:
            self.publish(
                ev.RecaptureFinished(
                    ok=False,
                    decode_bs=tuple(self.decode_buckets),
                    prefill_num_tokens=tuple(self.prefill_buckets),
                    message=str(e),
                )
            )
            return
        self._recapture_memory_before = sum(self.graph_memory())
        self._recapture_started = time.perf_counter()
        for phase, sizes in lists.items():
            runner = self.decode if phase == "decode" else self.prefill
            assert runner is not None
            runner.start_capture(sizes, "recapture")
        self.advance_capture()

    @property
    def capture_pending(self) -> bool:
        """A capture (the first one or a recapture) has buckets left to capture."""
        return any(r.capturing for r in self._runners())

    @property
    def capture_waiting(self) -> bool:
        """Every pending capture waits for kernels to compile (an idle engine has nothing to do but wait)."""
        capturing = [r for r in self._runners() if r.capturing]
        return bool(capturing) and all(r.waiting_for_kernels for r in capturing)

    @property
    def capture_needs_idle(self) -> bool:
        """The capture's next stage must run with no step in flight: always while capturing, unless
        recordings ride in-flight steps (``record_in_flight``) and every pending capture's next stage is
        a recording. The overlap schedule stops chaining steps while this holds."""
        if not self.record_in_flight:
            return self.capture_pending
        return any(r.next_stage_kind is StageKind.RUN for r in self._runners() if r.capturing)

    def notify_when_captured(self, done: threading.Event) -> None:
        """Set ``done`` once nothing is left to capture (at once when nothing is)."""
        if self.capture_pending:
            self._capture_waiters.append(done)
        else:
            done.set()

    def advance_capture(self, *, to_the_end: bool = False, ride: bool = False, idle: bool = False) -> bool:
        """Capture one more slice (``capture_slice``; everything with ``to_the_end``); True when this call
        finished the capture (the graphs' memory changed: the caller republishes its ledger).

        Where the step loop calls it: before a step's launch with nothing in flight, ``idle`` when there
        is no step to take (both kinds of stage then), or with ``ride`` right after a launch, the step on
        the device. With ``record_in_flight`` the slice before a launch runs only RUN stages and a ride
        only RECORD stages; without it a ride captures nothing."""
        if not self.capture_pending or (ride and not self.record_in_flight):
            return False
        limits = self.capture_slice(to_the_end)
        if self.record_in_flight and not (to_the_end or idle):
            limits = limits._replace(kinds=RECORD_ONLY if ride else RUN_ONLY)
        self._capture_slice(limits)
        if self.capture_pending:
            return False
        if self._recapture_started is not None:
            self._recapture_finished()
        self._wake_waiters()
        return True

    def _capture_slice(self, limits: CaptureSlice) -> None:
        capturing = [r for r in self._runners() if r.capturing]
        if not limits.by_stage:  # every runner, within the limits
            for runner in capturing:
                runner.advance_capture(limits.budget_s, limits.max_buckets, kinds=limits.kinds)
            return
        # one budget, the runners in turn (the next slice starts with the next runner); a runner whose next
        # bucket waits for its kernels captures nothing and passes the budget on
        start = time.perf_counter()
        n = len(capturing)
        captured = False
        for i in range(n):
            spent = time.perf_counter() - start
            if captured and limits.budget_s is not None and spent >= limits.budget_s:
                break
            left = None if limits.budget_s is None else max(0.0, limits.budget_s - spent)
            runner = capturing[(self._slice_turn + i) % n]
            if runner.next_stage_kind not in limits.kinds:
                continue  # its next stage waits for a slice of its kind
            runner.advance_capture(left, limits.max_buckets, by_stage=True, kinds=limits.kinds)
            captured = captured or not runner.waiting_for_kernels
        self._slice_turn = (self._slice_turn + 1) % max(1, n)

    def capture_slice(self, to_the_end: bool) -> CaptureSlice:
        """What one ``advance_capture`` may capture between two steps: ``RECAPTURE_SLICE_S`` shared by the
        runners, a stage at a time; nothing is limited ``to_the_end``. A tensor-parallel runner slices by
        whole buckets (engine/distributed/lockstep.py): its ranks capture in lockstep."""
        if to_the_end:
            return CaptureSlice()
        return CaptureSlice(budget_s=RECAPTURE_SLICE_S, by_stage=True)

    def _recapture_finished(self) -> None:
        assert self._recapture_started is not None
        after = sum(self.graph_memory())
        failed = [b for r in self._runners() for b in r.configured if b not in r.buckets]
        msg = "recaptured" if not failed else f"captured with failures: buckets {failed} run eagerly"
        self.publish(
            ev.RecaptureFinished(
                ok=not failed,
                decode_bs=tuple(self.decode_buckets),
                prefill_num_tokens=tuple(self.prefill_buckets),
                seconds=round(time.perf_counter() - self._recapture_started, 6),
                memory_freed_bytes=int(self._recapture_memory_before),
                memory_bytes=int(after),
                message=msg,
            )
        )
        self._recapture_started = None

    def _wake_waiters(self) -> None:
        waiters, self._capture_waiters = self._capture_waiters, []
        for done in waiters:
            done.set()

    # --- forward -------------------------------------------------------------------------------
    def decide(self, batch: ForwardBatch) -> tuple[Optional[BucketedGraphRunner], BucketDecision]:
        """The phase's graph runner and its decision for ``batch`` (the bucket it replays, or why it runs
        eagerly), made once per step: ``forward`` replays exactly this decision."""
        runner = self.decode if batch.mode is ForwardMode.DECODE else self.prefill
        if runner is not None:
            return runner, runner.decide(batch)
        r = self.resolved
        backend = r.decode_backend if batch.mode is ForwardMode.DECODE else r.prefill_backend
        if backend == "disabled":
            return None, BucketDecision(reason=FallbackReason.PHASE_DISABLED)
        if not r.available:
            return None, BucketDecision(reason=FallbackReason.NO_CUDA_GRAPHS)
        # enabled, but no bucket survived the limits
        return None, BucketDecision(reason=FallbackReason.NO_GRAPHS_CAPTURED)

    def fallback_reason(self, batch: ForwardBatch) -> Optional[FallbackReason]:
        """None when a graph takes ``batch``; otherwise why it runs eagerly."""
        return self.decide(batch)[1].reason

    def forward(self, batch: ForwardBatch) -> StepOutput:
        runner, decision = self.decide(batch)
        if runner is not None and decision.graph:
            return runner.run(batch, decision)
        out = self.eager.run(batch)
        out.fallback_reason = decision.reason
        return out

    def release(self) -> None:
        """Drop every graph (and its pool); the model runner serves eagerly afterwards."""
        for runner in self._runners():
            runner.release()
        self.decode = self.prefill = None
        self._wake_waiters()  # nothing is left to capture
