"""What decode and prefill graph runners share: the static token inputs, a bucket list, capture jobs whose
buckets go live as they are captured (in slices between steps, a stage at a time), recapture, the ledger."""

from __future__ import annotations

from abc import abstractmethod
from typing import AbstractSet, Callable, Iterator, Optional

import torch

from ...telemetry import events as ev
from ...telemetry.capture import BucketCost
from ..backend import GraphBackend, ShapeKey
from ..bucket_policy import BucketPolicy
from ..buffers import BufferRegistry, BufferSlot, PaddingPolicy
from ..fallback import FallbackReason
from .base import GraphRunner
from .capture import ANY_STAGE, CaptureJob, StageKind
from .kernel_gate import KernelGate

PublishFn = Callable[[ev.Event], None]

TOKEN_SLOTS = (
    BufferSlot("input_ids", lambda n: (n,), torch.int64, PaddingPolicy.ZERO, source=lambda b, p: b.input_ids),
    BufferSlot("positions", lambda n: (n,), torch.int64, PaddingPolicy.ZERO, source=lambda b, p: b.positions),
)
"""The static inputs of every graph runner's forward, declared first in its registry: the step's token
ids and their positions, a padded row reading token 0 at position 0."""


def ends_first(buckets: list[int]) -> list[int]:
    """``buckets`` smallest, largest, second smallest, second largest, ..."""
    ordered = sorted(buckets)
    out: list[int] = []
    while ordered:
        out.append(ordered.pop(0))
        if ordered:
            out.append(ordered.pop())
    return out


class BucketedGraphRunner(GraphRunner):
    phase: str = "?"

    def __init__(
        self,
        backend: GraphBackend,
        device: torch.device,
        publish: PublishFn,
        max_size: int,
        max_padding_waste: Optional[float] = None,
    ):
        self.backend = backend
        self.device = device
        self.publish = publish
        self.max_size = max_size
        self.max_padding_waste = max_padding_waste
        self.policy = BucketPolicy(self.phase, ())
        self.ledger: dict[int, BucketCost] = {}
        self.job: Optional[CaptureJob] = None
        self.gate: Optional[KernelGate] = None
        """Set (``ModelRunner``) where kernels compile in worker processes: a bucket is captured once its
        kernels are compiled."""
        self._warmup_size = 0  # a gated capture's warmup, run with its first bucket (their kernels match)
        # a subclass declares its own slots after these, then binds the backend to the registry
        self.registry = BufferRegistry(device, max_size)
        for slot in TOKEN_SLOTS:
            self.registry.declare(slot)

    def token_inputs(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``size`` rows of the static token ids and positions, as a graph's forward reads them."""
        return self.registry.view("input_ids", size), self.registry.view("positions", size)

    @property
    def configured(self) -> list[int]:
        """What was asked for, ascending."""
        return list(self.policy.configured)

    @property
    def buckets(self) -> list[int]:
        """What is captured and replayable, ascending."""
        return list(self.policy.buckets)

    def _set_buckets(self, buckets: list[int], configured: list[int]) -> None:
        self.policy = BucketPolicy.of(self.phase, buckets, configured, self.max_padding_waste)

    # --- capture -------------------------------------------------------------------------------
    def start_capture(self, buckets: list[int], reason: str) -> CaptureJob:
        """Release current graphs and begin capturing ``buckets`` in the backend's order; nothing is
        captured until ``advance_capture``. ``reason``: initial | recapture."""
        self.backend.cleanup()
        self.ledger = {}
        self.job = None
        self._set_buckets([], buckets)
        if self.gate is not None and reason != "initial":
            self.gate.forget()  # the lists, and kernel choices, may have changed since the last capture
        if self.backend.warms_up:
            if self.gate is None:
                self.warmup(max(buckets) if buckets else 0)
            else:  # compiling now would stall the step thread: it runs once the largest bucket's kernels are in
                self._warmup_size = max(buckets) if buckets else 0
        self.job = CaptureJob(
            self.phase,
            self.backend.capture_order(buckets),
            self.backend.name,
            self.device,
            self._capture_stages,
            self.publish,
            reason,
            self.gate,
            first_kind=self._first_stage_kind,
        )
        if self.gate is not None and reason == "initial":
            # at load, before any step: every bucket's kernels start compiling now, in parallel, so the
            # first eager steps find theirs on the way (a recapture finds them slice by slice instead);
            # smallest and largest alternate: the first requests' small steps and the first capture
            self.gate.look_ahead(ends_first(self.job.order), float("inf"))
        self._adopt(self.job)
        return self.job

    def advance_capture(
        self,
        budget_s: Optional[float],
        max_buckets: Optional[int] = None,
        by_stage: bool = False,
        kinds: AbstractSet[StageKind] = ANY_STAGE,
    ) -> bool:
        """Capture more of the running job (all of it when every limit is None; stages of ``kinds`` only)
        with the GC frozen (``GraphBackend.capture_session``); what it captured is live at once. True once
        nothing is pending."""
        if self.job is None:
            return True
        if self.job.next_kind not in kinds:
            return False
        with self.backend.capture_session():
            self.job.run(budget_s, max_buckets, by_stage, kinds)
        self._adopt(self.job)
        return self.job is None

    def _adopt(self, job: CaptureJob) -> None:
        """Make the buckets captured so far replayable; steps whose bucket is still to come run
        eagerly with the job's reason (graphs/bucket_policy.py)."""
        for c in job.ledger:
            self.ledger[c.bucket] = c
        replayable = [b for b in job.captured if all(self.backend.can_run(k) for k in self.graph_keys(b))]
        kept = self.agree_buckets(replayable)
        for b in set(replayable) - set(kept):  # captured here, failed on another rank
            for key in self.graph_keys(b):
                self.backend.release(key)
        reason = FallbackReason.NOT_YET_CAPTURED if job.reason == "initial" else FallbackReason.RECAPTURE_IN_PROGRESS
        if job.waiting:
            reason = FallbackReason.KERNELS_COMPILING
        self.policy = BucketPolicy.of(self.phase, kept, self.configured, self.max_padding_waste, job.remaining, reason)
        if job.done:
            self.job = None

    def agree_buckets(self, replayable: list[int]) -> list[int]:
        """The buckets to keep of those captured here. Alone: all of them; a tensor-parallel rank
        replaces this with the buckets every rank captured (engine/distributed/lockstep.py), since a
        step replays the same graph on every rank or runs eagerly on all of them."""
        return replayable

    @property
    def capturing(self) -> bool:
        return self.job is not None

    @property
    def next_stage_kind(self) -> Optional[StageKind]:
        """The kind of the capture's next stage (None: nothing is being captured)."""
        return None if self.job is None else self.job.next_kind

    @property
    def waiting_for_kernels(self) -> bool:
        """The capture's next bucket waits for its kernels to compile."""
        return self.job is not None and self.job.waiting

    def memory_bytes(self) -> int:
        return sum(c.memory_bytes for c in self.ledger.values() if c.ok)

    def release(self) -> None:
        self.job = None
        self.backend.cleanup()
        self._set_buckets([], self.configured)

    def graph_keys(self, size: int) -> list[ShapeKey]:
        """The graphs one bucket holds, in capture order: one, unless the runner captures variants of
        a bucket (decode over a fixed-width page table: one graph per table width). A bucket is live
        once all of them are captured, and its ledger entry covers them all."""
        return [ShapeKey(self.phase, size)]

    @abstractmethod
    def _prepare_capture(self, key: ShapeKey) -> None:
        """Static buffers back to their pad values and capture-time attention metadata for the graph
        ``key``, so a warmup or capture run can only touch the dummy KV page."""

    @abstractmethod
    def _forward(self, size: int) -> torch.Tensor:
        """The function a graph of ``size`` captures: static inputs in, the static output back."""

    @torch.inference_mode()
    def warmup(self, size: int) -> None:
        """Run the forward once eagerly outside capture (JIT, autotune, workspaces)."""
        if size <= 0:
            return
        self._prepare_capture(self.graph_keys(size)[0])
        self._forward(size)

    @torch.inference_mode()
    def dry_run(self, size: int) -> None:
        """Every forward a capture of bucket ``size`` runs, for ``KernelGate`` to see which kernels it
        launches (inside ``record_missing`` nothing uncompiled runs: the outputs are garbage)."""
        for key in self.graph_keys(size):
            self._prepare_capture(key)
            self._forward(size)

    def _first_stage_kind(self, size: int) -> StageKind:
        """What ``_capture_stages(size)`` announces first, known before it begins."""
        if self._warmup_size or (self.backend.runs_at_capture and self.backend.warms_up):
            return StageKind.RUN
        return self._recording_kind()

    def _recording_kind(self) -> StageKind:
        return StageKind.RUN if self.backend.executes_at_capture else StageKind.RECORD

    @torch.inference_mode()  # a generator: torch's decorator enters the mode around each resumption
    def _capture_stages(self, size: int) -> Iterator[StageKind]:
        """Bucket ``size``'s capture, a stage per ``next``, each announced by its kind first
        (runners/capture.py): the runner's warmup if it is due, then for each of the bucket's graphs its
        warmup forward and its recording. A slice between steps may stop between two stages, so no step
        waits for more than about one forward; the steps in between may replay other graphs, so each
        stage binds its own capture state (``_prepare_capture``)."""
        if self._warmup_size:
            yield StageKind.RUN
            self.warmup(self._warmup_size)
            self._warmup_size = 0
        for key in self.graph_keys(size):
            if self.backend.runs_at_capture and self.backend.warms_up:  # per-shape warmup outside capture
                yield StageKind.RUN
                self._prepare_capture(key)
                self._forward(size)
            yield self._recording_kind()
            if self.backend.runs_at_capture:  # an emulated capture that records addresses only needs nothing
                self._prepare_capture(key)
            self.backend.capture_one(key, lambda: self._forward(size))
