"""What decode and prefill graph runners share: a bucket list, capture jobs, recapture, the ledger."""

from __future__ import annotations

import bisect
from abc import abstractmethod
from typing import Callable, Optional

import torch

from ..telemetry import events as ev
from ..graphs.backend import GraphBackend, ShapeKey
from ..graphs.fallback import FallbackReason
from .base import GraphRunner
from .capture import BucketCapture, CaptureJob

PublishFn = Callable[[ev.Event], None]


class BucketedGraphRunner(GraphRunner):
    phase: str = "?"

    def __init__(self, backend: GraphBackend, device: torch.device, publish: PublishFn, max_size: int):
        self.backend = backend
        self.device = device
        self.publish = publish
        self.max_size = max_size
        self.configured: list[int] = []  # what was asked for
        self.buckets: list[int] = []  # what is captured and replayable, ascending
        self.ledger: dict[int, BucketCapture] = {}
        self.job: Optional[CaptureJob] = None

    # --- capture -------------------------------------------------------------------------------
    def start_capture(self, buckets: list[int], reason: str) -> CaptureJob:
        """Release current graphs and begin capturing ``buckets`` (largest first)."""
        self.backend.cleanup()
        self.configured = sorted(set(buckets))
        self.buckets = []
        self.ledger = {}
        self.warmup(max(self.configured) if self.configured else 0)
        self.job = CaptureJob(self.phase, self.configured, self.backend.name, self.device, self._capture_bucket,
                              self.publish, reason)
        if self.job.done:
            self._adopt(self.job)
        return self.job

    def advance_capture(self, budget_s: Optional[float]) -> bool:
        """Capture more of the running job; True once nothing is pending."""
        if self.job is None:
            return True
        if self.job.run(budget_s):
            self._adopt(self.job)
        return self.job is None

    def _adopt(self, job: CaptureJob) -> None:
        for c in job.ledger:
            self.ledger[c.bucket] = c
        self.buckets = [b for b in job.captured if self.backend.can_run(ShapeKey(self.phase, b))]
        self.job = None

    @property
    def recapturing(self) -> bool:
        return self.job is not None

    def memory_bytes(self) -> int:
        return sum(c.memory_bytes for c in self.ledger.values() if c.ok)

    def release(self) -> None:
        self.backend.cleanup()
        self.buckets = []

    @abstractmethod
    def _prepare_capture(self, size: int) -> None:
        """Static buffers back to their pad values and capture-time attention metadata for ``size``,
        so a warmup or capture run can only touch the dummy KV page."""

    @abstractmethod
    def _forward(self, size: int) -> torch.Tensor:
        """The function a graph of ``size`` captures: static inputs in, the static output back."""

    @torch.inference_mode()
    def warmup(self, size: int) -> None:
        """Run the forward once eagerly outside capture (JIT, autotune, workspaces)."""
        if size <= 0:
            return
        self._prepare_capture(size)
        self._forward(size)

    @torch.inference_mode()
    def _capture_bucket(self, size: int) -> None:
        self._prepare_capture(size)
        if self.device.type == "cuda":
            self._forward(size)  # per-shape warmup outside capture
        self.backend.capture_one(ShapeKey(self.phase, size), lambda: self._forward(size))

    # --- bucket choice -------------------------------------------------------------------------
    def pick_bucket(self, size: int) -> Optional[int]:
        i = bisect.bisect_left(self.buckets, size)
        return self.buckets[i] if i < len(self.buckets) else None

    def common_guard(self, size: int, over_max: FallbackReason) -> Optional[FallbackReason]:
        if self.recapturing:
            return FallbackReason.RECAPTURE_IN_PROGRESS
        if not self.buckets:
            return FallbackReason.CAPTURE_FAILED if self.configured else FallbackReason.NO_GRAPHS_CAPTURED
        if size > self.buckets[-1]:
            if self.configured and size <= self.configured[-1]:
                return FallbackReason.CAPTURE_FAILED
            return over_max
        return None
