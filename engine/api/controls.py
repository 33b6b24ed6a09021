"""How callers steer an engine while it serves: recapture its graphs, pace its parity checks, and wait
for its graphs to be captured.

A part the ``Engine`` (engine/engine.py) owns and delegates to. What changes the graphs or the parity
pacing is queued as a command and applied by the step loop between steps (engine/step/apply.py), so it
may be asked from any thread.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Optional, Sequence

from ..arguments import wait_timeout
from ..errors import EngineError, TensorParallelError
from ..parity.checker import ParityChecker
from ..step.commands import AwaitCapture, CommandQueue, Recapture, SetParityEvery
from ..step.serving import Serving
from ..telemetry import events as ev
from ..telemetry.bus import EventBus


class Controls:
    def __init__(self, tp: Any, bus: EventBus, commands: CommandQueue, parity: ParityChecker, serving: Serving) -> None:
        """``tp``: the tensor-parallel group, or None."""
        self.tp = tp
        self.bus = bus
        self.commands = commands
        self.parity = parity
        self.serving = serving

    def recapture(
        self,
        decode_bs: Optional[Sequence[int]] = None,
        prefill_num_tokens: Optional[Sequence[int]] = None,
        *,
        cause: str = "manual",
        detail: str = "",
    ) -> None:
        """See ``Engine.recapture``. ``cause`` (``manual``, ``auto_tune``) and ``detail`` go into the trace's
        ``recapture_requested`` event, and the metrics count recaptures by cause."""
        self.serving.check_open()  # a closed engine would publish a request that nothing ever answers
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
        """See ``Engine.set_parity_every``."""
        if isinstance(every, bool) or not isinstance(every, int):
            raise TypeError(f"parity every must be an int, got {type(every).__name__}")
        if every < 0:
            raise ValueError(f"parity every must be >= 0, got {every}")
        if every and self.tp is not None:
            raise ValueError("parity checks do not run with tensor parallelism (--tp > 1)")
        self.serving.check_open()
        self.commands.put(SetParityEvery(every))

    @property
    def parity_every(self) -> int:
        return self.parity.every

    def wait_for_capture(self, timeout: Optional[float] = None) -> bool:
        """See ``Engine.wait_for_capture``."""
        timeout = wait_timeout(timeout, "wait_for_capture")
        serving = self.serving
        serving.refuse_inside_step("wait_for_capture()")
        done = threading.Event()
        with serving.lifecycle:
            serving.check_open()
            self.commands.put(AwaitCapture(done))
        if serving.background_running:
            finished = done.wait(timeout)
        else:
            deadline = None if timeout is None else time.monotonic() + timeout
            while not done.is_set():
                serving.step()  # the first one applies the command
                if deadline is not None and time.monotonic() >= deadline:
                    break
            finished = done.is_set()
        if serving.closed:  # close sets every waiter's event: graphs are gone, not captured
            raise EngineError("the engine was closed while waiting for its graphs to capture")
        if serving.failure is not None:  # so does a tensor-parallel failure
            raise TensorParallelError(serving.failure)
        return finished
