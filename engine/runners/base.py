"""What every phase runner returns, and the contract graph runners add on top of eager."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Optional

import torch

from ..batch import ForwardBatch
from ..graphs.backend import ReplayTiming
from ..graphs.fallback import FallbackReason


@dataclass
class StepOutput:
    logits: torch.Tensor  # [len(batch.sample_rows), vocab] float32
    path: str  # graph | eager
    bucket: Optional[int] = None
    padded: int = 0
    fallback_reason: Optional[FallbackReason] = None
    timing: Optional[ReplayTiming] = None
    # each row's argmax (int64, on the device) when the step took it already (decode graphs do)
    tokens: Optional[torch.Tensor] = None
    # the same tokens in pinned host memory, written by the step's own kernels (CUDA decode graphs):
    # readable once the work queued so far has run, without a device-to-host copy
    tokens_host: Optional[torch.Tensor] = None

    def read_timing(self) -> tuple[Optional[float], Optional[float], Optional[float]]:
        """(replay_ms, segment_ms, break_ms); call only after the step's own sync."""
        if self.timing is None:
            return None, None, None
        return self.timing.read()


class Runner(ABC):
    @abstractmethod
    def run(self, batch: ForwardBatch) -> StepOutput: ...


class GraphRunner(Runner):
    @abstractmethod
    def can_run(self, batch: ForwardBatch) -> Optional[FallbackReason]:
        """None when this batch can replay a graph; otherwise the named reason it cannot."""
