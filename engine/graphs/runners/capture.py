"""Capturing a bucket list in the backend's order, per-bucket time and memory, failures dropped and reported.

A ``CaptureJob`` runs a slice at a time between engine steps, so requests keep streaming while graphs
are built (the initial capture while the engine already serves, and live recapture). An engine that
captures before serving runs it to completion at once. A bucket's capture comes in stages (its warmup
forward, then the recording of each of its graphs: ``BucketedGraphRunner._capture_stages``), and a slice
between steps may be one stage, so no step waits for more than one forward's worth of capture work.
With a gate (runners/kernel_gate.py) a bucket is captured only once its kernels are compiled, so no
capture waits for a compiler.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Iterator, Optional

import torch

from ...telemetry import events as ev
from ...telemetry.capture import BucketCost
from .kernel_gate import BucketGate

PublishFn = Callable[[ev.Event], None]

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
        capture: Callable[[int], Optional[Iterable[None]]],
        publish: PublishFn,
        reason: str = "initial",
        gate: Optional[BucketGate] = None,
    ):
        """``order``: the buckets in the order to capture them (``GraphBackend.capture_order``);
        ``capture(bucket)``: captures it, or returns an iterable of its stages (each ``next`` runs one);
        ``gate``: whether a bucket's kernels are compiled (None: capture compiles what it launches)."""
        self.phase = phase
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
        self._stages: Optional[Iterator[None]] = None  # the bucket in progress, between two slices
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
    def mid_bucket(self) -> bool:
        """A bucket's capture has begun and has stages left (a slice of one stage stopped in it)."""
        return self._stages is not None

    def run(self, budget_s: Optional[float] = None, max_buckets: Optional[int] = None, by_stage: bool = False) -> bool:
        """Capture buckets until done, ``budget_s`` has passed or ``max_buckets`` are captured (at least
        one stage, if its kernels are compiled); ``by_stage``: the budget is looked at after every stage,
        not only after every bucket. Returns done. (Ranks of a tensor-parallel group slice by count:
        their clocks differ.)"""
        start = time.perf_counter()
        count = 0
        while not self.done:
            if self._stages is None and not self._kernels_ready(start, budget_s):
                break
            over = self._capture_stage(self.order[self._next], whole=not by_stage)
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

    def _capture_stage(self, bucket: int, whole: bool) -> bool:
        """Run ``bucket``'s next stage (all that are left, ``whole``); True once the bucket is over, captured
        or failed, and its cost is in the ledger."""
        if self._stages is None:
            self._bucket_free0 = device_free_bytes(self.device)
            self._bucket_s = 0.0
        t0 = time.perf_counter()
        failure = None
        over = False
        try:
            if self._stages is None:
                stages = self.capture(bucket)
                self._stages = iter(stages) if stages is not None else iter(())
            if whole:
                for _ in self._stages:
                    pass
                over = True
            else:
                next(self._stages)
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
        self._stages = None
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
