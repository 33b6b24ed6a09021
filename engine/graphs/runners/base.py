"""What every phase runner returns, the eager runner's contract, and the graph runners'.

A graph runner decides a step's bucket once (``decide``) and replays exactly that decision (``run``): the
model runner asks for the decision, runs eagerly with its named reason when it is not a graph, and
otherwise hands it to ``run``, so the bucket that was judged is the bucket that is replayed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from ...batch import ForwardBatch
from ..backend import ReplayTiming
from ..bucket_policy import BucketDecision
from ..fallback import FallbackReason


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
    # an eager CUDA step's GPU time in ms, readable after the step's own sync (``EagerRunner``)
    forward_time: Optional[Callable[[], float]] = None
    # [len(batch.prompt_rows), vocab]: the logits that score prompt tokens, when the batch has such rows
    prompt_logits: Optional[torch.Tensor] = None

    @classmethod
    def of_rows(cls, logits: torch.Tensor, batch: ForwardBatch, **fields: Any) -> "StepOutput":
        """A prefill step's output from the logits of ``batch.logit_rows``: the sampled rows' first, then
        the prompt-scoring rows' (``prompt_logits``)."""
        if not batch.prompt_rows:
            return cls(logits=logits, **fields)
        n = len(batch.sample_rows)
        return cls(logits=logits[:n], prompt_logits=logits[n:], **fields)

    def read_timing(self) -> tuple[Optional[float], Optional[float], Optional[float]]:
        """(replay_ms, segment_ms, break_ms); call only after the step's own sync."""
        if self.timing is None:
            return None, None, None
        return self.timing.read()

    def read_forward_ms(self) -> Optional[float]:
        """An eager step's GPU time; call only after the step's own sync."""
        return self.forward_time() if self.forward_time is not None else None


class Runner(ABC):
    """The path that takes every batch (the eager runner)."""

    @abstractmethod
    def run(self, batch: ForwardBatch) -> StepOutput: ...


class GraphRunner(ABC):
    """A fast path that takes some batches: the ones its captured graphs fit."""

    @abstractmethod
    def decide(self, batch: ForwardBatch) -> BucketDecision:
        """The bucket this batch replays and its padding, or the named reason it cannot replay one."""

    @abstractmethod
    def run(self, batch: ForwardBatch, decision: BucketDecision) -> StepOutput:
        """Replay the graph ``decision`` (a graph decision of ``decide`` for this batch) names."""
