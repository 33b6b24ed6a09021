"""Capturing a bucket list in the backend's order, per-bucket time and memory, failures dropped and reported.

A ``CaptureJob`` runs a slice at a time between engine steps, so requests keep streaming while graphs
are built (the initial capture while the engine already serves, and live recapture). An engine that
captures before serving runs it to completion at once. A bucket's capture comes in stages (its warmup
forward, then the recording of each of its graphs: ``BucketedGraphRunner._capture_stages``), and a slice
between steps may be one stage, so no step waits for more than one forward's worth of capture work.
With a gate (runners/kernel_gate.py) a bucket is captured only once its kernels are compiled, so no
capture waits for a compiler.

Stages are of two kinds (``StageKind``). A RUN stage executes the model on the device (a warmup forward,
a kernel gate's dry run, an emulated capture that runs its function): it writes buffers that a step in
flight still reads, so it runs only with nothing in flight, before a step's launch. A RECORD stage only
records a graph: whatever it puts on the device (pad values into the static buffers, a capture-time
attention plan, the breaks of a breakable graph on the dummy KV page) is ordered after everything already
launched and touches only what the next step rewrites anyway, so it may run while a step is in flight,
its host time hidden behind that step's device time (``ModelRunner.advance_capture(ride=True)``).
"""

from __future__ import annotations

import time
from enum import Enum
from typing import AbstractSet, Callable, Iterable, Iterator, Optional

import torch

from ...telemetry import events as ev
from ...telemetry.capture import BucketCost
from .kernel_gate import BucketGate

PublishFn = Callable[[ev.Event], None]


class StageKind(str, Enum):
    """What a capture stage does on the device (module docstring): RUN executes the model, RECORD records."""

    RUN = "run"
    RECORD = "record"


ANY_STAGE: frozenset[StageKind] = frozenset(StageKind)

LOOK_AHEAD_PER_SLICE = 1
"""Buckets a slice dry-runs ahead while it waits for kernels: enough to keep the workers fed (a compile
takes seconds, a step milliseconds), few enough that no step's host time grows by more than a forward."""


def device_free_bytes(device: torch.device) -> int:
    """The driver's free memory: allocations (cudaMalloc, by the caching allocator or a graph's pool) show
    at once, so no synchronize is needed, and none may be: a capture slice runs between steps, and a
    synchronize there would wait out every step still queued on the GPU (the overlap schedule keeps one
    queued), which is what a step's host time must not include."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return 0


class CaptureJob:
    def __init__(
        self,
        phase: str,
        order: list[int],
        backend_name: str,
        device: torch.device,
        capture: Callable[[int], Optional[Iterable[StageKind]]],
        publish: PublishFn,
        reason: str = "initial",
        gate: Optional[BucketGate] = None,
        first_kind: Optional[Callable[[int], StageKind]] = None,
    ):
        """``order``: the buckets in the order to capture them (``GraphBackend.capture_order``);
        ``capture(bucket)``: captures it (one RUN stage), or returns an iterable of its stages that yields
        each stage's kind before running it (the first ``next`` runs nothing, each later one runs the stage
        announced before); ``gate``: whether a bucket's kernels are compiled (None: capture compiles what it
        launches); ``first_kind(bucket)``: the kind of a bucket's first stage, known before it begins
        (None: RUN, to be safe). A bucket begins inside a slice that may run its first stage, so a slice
        that finds another kind announced simply stops."""
        self.phase = phase
        self.first_kind = first_kind
        self.reason = reason
        self.order = list(dict.fromkeys(order))
        self.device = device
        self.capture = capture
        self.publish = publish
        self.ledger: list[BucketCost] = []
        self.gate = gate
        self.waiting = False
        """The last slice stopped at a bucket whose kernels were still compiling."""
        self._next = 0
        self._stages: Optional[Iterator[StageKind]] = None  # the bucket in progress, between two slices
        self._announced: Optional[StageKind] = None  # the kind of its next stage
        self._bucket_s = 0.0  # its capture time so far
        self._bucket_free0 = 0
        self._t0 = time.perf_counter()
        self._free0 = device_free_bytes(device)
        publish(ev.CaptureStarted(phase=phase, buckets=tuple(self.order), backend=backend_name, reason=reason))
        if not self.order:
            self._finish()

    @property
    def done(self) -> bool:
        return self._next >= len(self.order)

    @property
    def remaining(self) -> list[int]:
        """Buckets not attempted yet."""
        return self.order[self._next :]

    @property
    def next_kind(self) -> Optional[StageKind]:
        """The kind of the next stage: the announced one of the bucket in progress, or the next bucket's
        first (``first_kind``) once its kernels are in; RUN while a kernel gate's dry run may still be due,
        or where a capture may run whole; None when done."""
        if self.done:
            return None
        if self._stages is not None:
            return self._announced if self._announced is not None else StageKind.RUN
        bucket = self.order[self._next]
        if self.first_kind is None or not (self.gate is None or self.gate.ready_without_running(bucket)):
            return StageKind.RUN
        return self.first_kind(bucket)

    def _begin(self, bucket: int) -> None:
        """Start ``bucket``'s capture: its stages, the first one announced (nothing runs yet)."""
        self._bucket_free0 = device_free_bytes(self.device)
        self._bucket_s = 0.0
        stages = self.capture(bucket)  # None: captured whole by the call
        self._stages = iter(stages) if stages is not None else iter(())
        self._announced = next(self._stages, None)

    @property
    def mid_bucket(self) -> bool:
        """A bucket's capture has begun and has stages left (a slice of one stage stopped in it)."""
        return self._stages is not None

    def run(
        self,
        budget_s: Optional[float] = None,
        max_buckets: Optional[int] = None,
        by_stage: bool = False,
        kinds: AbstractSet[StageKind] = ANY_STAGE,
    ) -> bool:
        """Capture buckets until done, ``budget_s`` has passed or ``max_buckets`` are captured (at least
        one stage, if its kernels are compiled); ``by_stage``: the budget is looked at after every stage,
        not only after every bucket; ``kinds``: stop before a stage of another kind (it waits for a slice
        that allows it). Returns done. (Ranks of a tensor-parallel group slice by count: their clocks
        differ.)"""
        start = time.perf_counter()
        count = 0
        while not self.done:
            if self.next_kind not in kinds:
                break
            if self._stages is None and not self._kernels_ready(start, budget_s):
                break
            over = self._capture_stage(self.order[self._next], whole=not by_stage, kinds=kinds)
            if not over:
                if budget_s is not None and time.perf_counter() - start >= budget_s:
                    break
                continue
            self._next += 1
            count += 1
            if self.done:
                self._finish()
                break
            if budget_s is not None and time.perf_counter() - start >= budget_s:
                break
            if max_buckets is not None and count >= max_buckets:
                break
        return self.done

    def _kernels_ready(self, start: float, budget_s: Optional[float]) -> bool:
        """Whether the next bucket's kernels are compiled (waiting for them when the job runs to the end).
        While they compile, the rest of the slice's budget finds the kernels of the buckets after it."""
        self.waiting = False
        if self.gate is None:
            return True
        bucket = self.order[self._next]
        if budget_s is None:
            self.gate.look_ahead(self.order[self._next :], float("inf"))  # all of them compile in parallel
            self.gate.wait(bucket)
            return True
        if self.gate.ready(bucket):
            return True
        # one more bucket's dry run per slice: a step never pays for more than two (this one's and that one)
        self.gate.look_ahead(self.order[self._next + 1 :], start + budget_s, LOOK_AHEAD_PER_SLICE)
        self.waiting = True
        return False

    def _capture_stage(self, bucket: int, whole: bool, kinds: AbstractSet[StageKind] = ANY_STAGE) -> bool:
        """Run ``bucket``'s next stage (all that are left of ``kinds``, ``whole``); True once the bucket is
        over, captured or failed, and its cost is in the ledger."""
        t0 = time.perf_counter()
        failure = None
        over = False
        try:
            if self._stages is None:
                self._begin(bucket)
                if self._announced is None:  # captured whole by the call, or no stages at all
                    raise StopIteration
                if self._announced not in kinds:
                    self._bucket_s += time.perf_counter() - t0
                    return False
            while True:
                self._announced = next(self._stages)  # runs the announced stage, says what comes next
                if not whole or self._announced not in kinds:
                    break
        except StopIteration:
            over = True
        except torch.OutOfMemoryError:
            failure = "out of memory"
        except Exception as e:  # a shape that cannot be captured must not take the engine down
            failure = f"{type(e).__name__}: {e}".splitlines()[0][:200]
        if failure and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
        self._bucket_s += time.perf_counter() - t0
        if not (over or failure):
            return False
        self._stages = self._announced = None
        seconds = self._bucket_s
        mem = max(0, self._bucket_free0 - device_free_bytes(self.device)) if failure is None else 0
        self.ledger.append(BucketCost(self.phase, bucket, seconds, mem, failure is None, failure))
        self.publish(
            ev.CaptureProgress(
                phase=self.phase,
                bucket=bucket,
                index=self._next + 1,
                total=len(self.order),
                seconds=round(seconds, 6),
                memory_bytes=mem,
                ok=failure is None,
                failure_reason=failure,
            )
        )
        return True

    @property
    def captured(self) -> list[int]:
        return sorted(c.bucket for c in self.ledger if c.ok)

    @property
    def failed(self) -> list[BucketCost]:
        return [c for c in self.ledger if not c.ok]

    def _finish(self) -> None:
        failed = self.failed
        compiled, cached = (0, 0)
        if self.gate is not None:
            compiled, cached = self.gate.kernel_counts()
            self.gate.finish(ok=not failed)
        reason = None
        if failed:
            largest = max(failed, key=lambda c: c.bucket)
            reason = f"{len(failed)} bucket(s) failed; largest {largest.bucket}: {largest.failure_reason}"
        self.publish(
            ev.CaptureFinished(
                phase=self.phase,
                captured=tuple(self.captured),
                failed=tuple(sorted(c.bucket for c in failed)),
                seconds=round(time.perf_counter() - self._t0, 6),
                memory_bytes=max(0, self._free0 - device_free_bytes(self.device)),
                ok=not failed,
                failure_reason=reason,
                kernels_compiled=compiled,
                kernels_cached=cached,
            )
        )
