"""Overlap schedule: prepare and launch decode step N+1 while the GPU still runs step N.

Why: a graph decode step of a small model is ~1-2 ms of GPU work, and the host needs a comparable
time to schedule, fill static buffers, plan attention, read tokens back and stream them. Done one
after the other, the GPU idles while the host works. With the overlap schedule the host launches
N+1 (its input ids are N's sampled tokens, still on the device: a device-to-device copy into the
static buffer) before it waits for N's tokens, so host work hides behind GPU work. SGLang calls this
the overlap scheduler.

When it applies: step N was a plain greedy decode step (no penalty, bias or logprobs), and N+1 is
certain to be a decode step of exactly the same requests: nothing queued or cancelled, no request that
N's token could end by length or context, enough free pages that no one is preempted, no capture under
way (capture runs between steps only when nothing is in flight). A request that N's token ends by EOS
or a stop string has computed one extra row in N+1, which is dropped (its KV slot is freed with the
request; later users of the slot run after N+1 on the same stream). Anything else
completes N first and schedules as usual, so outputs are token-for-token those of the plain loop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import torch

from graphtop.models.kernels.argmax import argmax_rows

from ..batch import ForwardBatch, ForwardMode
from ..graphs.runners.base import StepOutput
from ..kv_pool import KVPool
from ..request import RequestStatus
from ..scheduler import Scheduler

PLACEHOLDER_TOKEN = -1
"""Stands in a request's output_ids for a token still on the device (replaced when read back)."""


@dataclass
class InFlightStep:
    """A decode step launched but not read back yet."""

    batch: ForwardBatch
    out: StepOutput
    tokens_device: torch.Tensor  # [bs] int64: the next step's input ids
    tokens_host: torch.Tensor  # [bs] int64, receives tokens_device (pinned on CUDA)
    ready: Optional[torch.cuda.Event]  # recorded after the copy to tokens_host; None on CPU
    host_ms: float  # host time to launch the step (schedule excluded)

    def tokens(self) -> list[int]:
        """The step's sampled tokens; waits (GIL released) for the device only here."""
        if self.ready is not None:
            self.ready.synchronize()
        return self.tokens_host.tolist()


class TokenReadback:
    """Two pinned host buffers used in turn: step N's copy lands in one while N+1's targets the other."""

    def __init__(self, device: torch.device, max_rows: int) -> None:
        self.device = device
        self.max_rows = max_rows
        self._bufs: list[torch.Tensor] = []
        self._turn = 0

    def launch(self, batch: ForwardBatch, out: StepOutput, t0: float) -> InFlightStep:
        """Greedy-sample ``out`` on the device (unless its graph did) and start copying the tokens to
        the host."""
        tokens = out.tokens if out.tokens is not None else argmax_rows(out.logits)
        if self.device.type != "cuda":  # a copy: a graph's token buffer is rewritten by the next step
            return InFlightStep(batch, out, tokens, tokens.clone(), None, (time.perf_counter() - t0) * 1e3)
        if out.tokens_host is not None:  # the graph writes them to the host itself: nothing to copy
            ready = torch.cuda.Event()
            ready.record()
            return InFlightStep(batch, out, tokens, out.tokens_host, ready, (time.perf_counter() - t0) * 1e3)
        n = tokens.shape[0]
        if not self._bufs or n > self._bufs[0].shape[0]:
            size = max(n, self.max_rows)
            self._bufs = [torch.empty(size, dtype=torch.int64, pin_memory=True) for _ in range(2)]
        host = self._bufs[self._turn][:n]
        self._turn ^= 1
        host.copy_(tokens, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return InFlightStep(batch, out, tokens, host, ready, (time.perf_counter() - t0) * 1e3)


def launchable(batch: ForwardBatch) -> bool:
    """May this step run without waiting for its tokens? Decode steps of plain greedy rows only
    (``SamplingParams.plain``: a row with penalties, bias, min_tokens or logprobs needs the sampler)."""
    return batch.mode is ForwardMode.DECODE and all(r.params.plain for r in batch.sample_requests)


def can_chain(
    pending: InFlightStep, scheduler: Scheduler, pool: KVPool, max_context_len: int, capture_pending: bool
) -> bool:
    """True when the step after ``pending`` is certain to decode exactly ``pending``'s requests."""
    if scheduler.waiting or capture_pending:
        return False
    reqs = pending.batch.requests
    running = scheduler.running
    if len(running) != len(reqs) or any(a is not b for a, b in zip(running, reqs)):
        return False
    if pool.free_pages < len(reqs):  # growth could preempt someone
        return False
    for r in reqs:
        if r.status is not RequestStatus.RUNNING:
            return False
        # the token in flight may end the request by length: no guessing, and a token of context spare
        if r.ends_by_length(len(r.output_ids) + 1, max_context_len, pool.capacity_tokens, spare=1):
            return False
    return True
