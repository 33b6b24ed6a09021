"""Graph capture on a thread of its own while the step thread serves (``EngineConfig.capture_thread``).

Why: a bucket's capture (its warm-up forward, the recording, the instantiation) takes tens to hundreds of
milliseconds for an 8B model; run in slices between steps, it made every step taken while graphs captured
wait for one. Here a capture thread records graphs on its backend's own stream in thread-local capture mode
(CUDA calls of other threads stay legal), and the step thread keeps stepping: eagerly, or by replaying the
buckets already live.

What the two threads share, and how each is kept apart:

* **A graph runner's host state** (its attention instance's metadata, views of its static buffers, its
  bridges): the graph runners' lock (``ModelRunner.graphs_lock``). The capture thread holds it while it
  prepares and records one graph. A step whose bucket is live but finds the lock held runs eagerly
  (``FallbackReason.CAPTURE_RUNNING``): it never waits for a capture. The graph runners have an attention
  instance of their own (``AttentionBackend.clone``), so eager steps never touch what a capture binds.
* **Device memory that work of both threads writes** (the GEMV and MLP kernels' global workspaces, a
  runner's static inputs, the dummy KV page): work the capture thread *runs* (static buffers reset to their
  pad values, warm-up forwards, a gate's dry runs, a breakable capture's eager attention) takes the device
  turn (``DeviceTurn``): the capture stream first waits for everything the step stream has queued, and the
  step stream then waits for the capture stream. The step thread holds the turn while it launches a
  forward, so nothing it launches runs beside such work. Recording a graph runs nothing.
* **Outputs**: warm-ups write scratch outputs (``DecodeGraphRunner``), never the logits, tokens and host
  ring of a step the step thread has not read back yet.
* **Events**: a capture job's progress is queued and published by the step thread
  (``BucketedGraphRunner.poll_capture``), so events keep flowing from one thread, in order.

The two threads share the GIL: every torch call and kernel launch releases it, so they interleave at
launch granularity, and while the thread runs the interpreter's switch interval is at most
``SWITCH_INTERVAL_S`` (engine/switch_interval.py), which bounds what a step waits when the capture thread
runs Python without a launch (docs/benchmarks.md has the step host times while capturing).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import TYPE_CHECKING, Callable, Iterator, Optional, Protocol, Sequence

import torch

from .. import switch_interval

if TYPE_CHECKING:  # pragma: no cover
    from .capture import CaptureJob


class CapturingRunner(Protocol):
    """What the capture thread needs of a graph runner (runners/bucketed.py): its phase and its job."""

    phase: str
    job: Optional["CaptureJob"]


log = logging.getLogger("graphtop.engine")

_here = threading.local()

KERNEL_POLL_S = 0.005
"""How long the capture thread naps while every pending bucket waits for its kernels to compile."""

SWITCH_INTERVAL_S = 0.0005
"""The interpreter's switch interval while the capture thread runs (CPython's default is 5 ms): the longest
the step thread waits for the GIL when the capture thread is in pure Python."""


def on_capture_thread() -> bool:
    """Whether the caller runs on a capture thread (its events are queued for the step thread)."""
    return getattr(_here, "capturing", False)


class DeviceTurn:
    """Which thread may queue device work that touches memory both threads write: the step thread (each
    forward it launches) or the capture thread (work it runs). Once the capture thread asks, it goes next,
    so a busy step thread cannot starve it; a step then waits at most for one turn of the capture thread
    (a warm-up forward's launches, a few milliseconds). Without a capture thread both are free: the step
    thread is alone (``active`` is False)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.active = False
        """Whether a capture thread runs (else ``step`` costs nothing)."""
        self._cond = threading.Condition()
        self._owner: Optional[str] = None  # "step" | "capture" | None
        self._capture_asks = False

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Around a step's forward, on the step thread."""
        if not self.active:
            yield
            return
        with self._cond:
            while self._owner is not None or self._capture_asks:
                self._cond.wait()
            self._owner = "step"
        try:
            yield
        finally:
            self._release()

    @contextlib.contextmanager
    def capture(self, stream: Optional["torch.cuda.Stream"]) -> Iterator[None]:
        """Around work the capture thread runs on ``stream`` (None: no CUDA, nothing to order). On the step
        thread itself (no capture thread) it only switches streams."""
        if self.active:
            with self._cond:
                self._capture_asks = True
                while self._owner is not None:
                    self._cond.wait()
                self._capture_asks = False
                self._owner = "capture"
        try:
            if stream is None:
                yield
            else:
                main = torch.cuda.default_stream(self.device)  # the step thread queues its steps there
                stream.wait_stream(main)
                with torch.cuda.stream(stream):
                    yield
                main.wait_stream(stream)
        finally:
            if self.active:
                self._release()

    def _release(self) -> None:
        with self._cond:
            self._owner = None
            self._cond.notify_all()


class CaptureThread:
    """Runs the graph runners' capture jobs to the end, one bucket at a time, off the step thread."""

    def __init__(self, device: torch.device, turn: DeviceTurn) -> None:
        self.device = device
        self.turn = turn
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._switch_ask: Optional[int] = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, runners: Sequence[CapturingRunner]) -> None:
        """Capture every job of ``runners`` in order (the thread of a previous start must be stopped)."""
        assert not self.running, "stop the capture thread before starting another"
        jobs = [r for r in runners if r.job is not None and not r.job.done]
        if not jobs:
            return
        self._stop.clear()
        self.turn.active = True
        self._switch_ask = switch_interval.at_most(SWITCH_INTERVAL_S)
        self._thread = threading.Thread(target=self._run, args=(jobs,), name="graphtop-capture", daemon=True)
        self._thread.start()

    def stop(self, timeout: Optional[float] = None) -> None:
        """Stop after the graph being captured (a recapture, or closing); its job keeps what it captured."""
        self._stop.set()
        self.wait(timeout)

    def wait(self, timeout: Optional[float] = None) -> None:
        """Until every job is done (or the thread was stopped)."""
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self, runners: list[CapturingRunner]) -> None:
        _here.capturing = True
        try:
            with torch.inference_mode():
                self._capture_all(runners)
        finally:
            self.turn.active = False
            switch_interval.release(self._switch_ask)

    def _capture_all(self, runners: list[CapturingRunner]) -> None:
        """A bucket of each runner in turn, as its kernels come in (every bucket's compile starts first);
        while none is ready, nap. A runner whose job raises is given up (``CaptureJob.abandon``)."""
        for runner in runners:
            self._guarded(runner, lambda job: job.look_ahead())
        while not self._stop.is_set():
            pending = [r for r in runners if r.job is not None and not r.job.done]
            if not pending:
                return
            captured = 0
            for runner in pending:
                if self._stop.is_set():
                    return
                before = len(runner.job.ledger) if runner.job is not None else 0
                self._guarded(runner, lambda job: job.run(0.0, max_buckets=1))  # one bucket, if its kernels are in
                captured += (len(runner.job.ledger) if runner.job is not None else 0) - before
            if not captured:
                time.sleep(KERNEL_POLL_S)

    def _guarded(self, runner: CapturingRunner, work: Callable[["CaptureJob"], object]) -> None:
        job = runner.job
        if job is None or job.done:
            return
        try:
            work(job)
        except Exception:  # a failed bucket is the job's to record: anything else must not hang a start
            log.exception("the capture thread failed; %s graphs stop capturing", runner.phase)
            job.abandon("the capture thread failed")
