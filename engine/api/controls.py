"""How callers steer an engine while it serves: recapture its graphs, pace its parity checks, serve
its telemetry to viewers, and wait for its graphs to be captured.

A mixin of ``Engine`` (engine/engine.py): the engine holds the state these methods use, annotated
below. What changes the graphs or the parity pacing is queued as a command and applied by the step
loop between steps (engine/step/commands.py), so it may be asked from any thread.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional, Sequence

from ..arguments import wait_timeout
from ..errors import EngineError, TensorParallelError
from ..parity.checker import ParityChecker
from ..step.commands import AwaitCapture, CommandQueue, Recapture, SetParityEvery
from ..telemetry import events as ev
from ..telemetry.bus import EventBus


class ControlApi:
    # the engine's, set in Engine.__init__
    tp: Any
    bus: EventBus
    commands: CommandQueue
    parity: ParityChecker
    telemetry: Any
    background_running: bool
    _lifecycle: threading.Lock
    _closed: bool
    _failure: Optional[str]
    _check_open: Callable[[], None]
    refuse_inside_step: Callable[[str], None]
    step: Callable[[], bool]

    def recapture(
        self,
        decode_bs: Optional[Sequence[int]] = None,
        prefill_num_tokens: Optional[Sequence[int]] = None,
        *,
        cause: str = "manual",
        detail: str = "",
    ) -> None:
        """Replace the captured graphs at the next step boundary; in-flight requests continue.
        ``cause`` (``manual``, ``auto_tune``) and ``detail`` go into the trace's ``recapture_requested``
        event, and the metrics count recaptures by cause."""
        self._check_open()  # a closed engine would publish a request that nothing ever answers
        cmd = Recapture(
            tuple(decode_bs) if decode_bs is not None else None,
            tuple(prefill_num_tokens) if prefill_num_tokens is not None else None,
        )
        self.bus.publish(
            ev.RecaptureRequested(
                decode_bs=cmd.decode_bs, prefill_num_tokens=cmd.prefill_num_tokens, cause=cause, detail=detail
            )
        )
        self.commands.put(cmd)

    def set_parity_every(self, every: int) -> None:
        """Check one graph step in ``every`` against an eager re-run (0: off), from the next step on;
        thread-safe. A problem (too little free KV for the scratch pages) is an ``error`` event."""
        if isinstance(every, bool) or not isinstance(every, int):
            raise TypeError(f"parity every must be an int, got {type(every).__name__}")
        if every < 0:
            raise ValueError(f"parity every must be >= 0, got {every}")
        if every and self.tp is not None:
            raise ValueError("parity checks do not run with tensor parallelism (--tp > 1)")
        self._check_open()
        self.commands.put(SetParityEvery(every))

    @property
    def parity_every(self) -> int:
        return self.parity.every

    def serve_telemetry(self, address: str = "ipc", *, runtime_dir: Any = None, server: Any = None) -> Any:
        """Serve this engine's events on an endpoint that viewers attach to (``graphtop attach``,
        ``graphtop ps``) and take their commands back. ``address``: "ipc" (a private Unix socket) or
        "tcp://HOST:PORT" (token-protected). Returns the ``TelemetryServer``; ``close()`` ends it."""
        from ..lifecycle.telemetry_link import serve_telemetry

        self._check_open()
        if self.telemetry is not None and not self.telemetry.closed:
            raise EngineError(
                f"this engine already serves telemetry at {self.telemetry.endpoint}; close that server first"
            )
        self.telemetry = serve_telemetry(self, address, runtime_dir=runtime_dir, server=server)
        return self.telemetry

    def wait_for_capture(self, timeout: Optional[float] = None) -> bool:
        """Block until every graph asked for so far (the first capture, and any recapture requested
        before this call) is captured or failed. With the background thread this waits; otherwise it
        drives ``step()`` itself (requests in flight are served meanwhile). False on timeout; an
        EngineError if the engine is (or gets) closed. ``timeout`` None or ``inf`` waits forever; NaN is a
        ValueError (``engine/arguments.py``)."""
        timeout = wait_timeout(timeout, "wait_for_capture")
        self.refuse_inside_step("wait_for_capture()")
        done = threading.Event()
        with self._lifecycle:
            self._check_open()
            self.commands.put(AwaitCapture(done))
        if self.background_running:
            finished = done.wait(timeout)
        else:
            deadline = None if timeout is None else time.monotonic() + timeout
            while not done.is_set():
                self.step()  # the first one applies the command
                if deadline is not None and time.monotonic() >= deadline:
                    break
            finished = done.is_set()
        if self._closed:  # close sets every waiter's event: graphs are gone, not captured
            raise EngineError("the engine was closed while waiting for its graphs to capture")
        if self._failure is not None:  # so does a tensor-parallel failure
            raise TensorParallelError(self._failure)
        return finished
