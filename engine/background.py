"""The engine's own serving thread (``Engine.start_background``): step while there is work, sleep on
the command queue's wake event when there is none.

A step that raises must not end serving: the requests in flight fail with the reason (an ``error``
event says what broke) and the loop goes on with whatever comes next. Only a tensor-parallel failure
ends it, since no step can run once a rank is gone.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Optional

from .distributed.errors import TensorParallelError
from .telemetry import events as ev

log = logging.getLogger("graphtop.engine")

IDLE_WAIT_S = 0.05  # longest sleep between polls while idle (a command wakes the loop at once)


class BackgroundServer:
    def __init__(self, step: Callable[[], bool], wake: threading.Event, fail_running: Callable[[str], None],
                 publish: Callable[[ev.Event], None]) -> None:
        self._step, self._wake, self._fail_running, self._publish = step, wake, fail_running, publish
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.last_error: Optional[str] = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def owns_current_thread(self) -> bool:
        """The caller is the serving thread itself (its own step calls are the only ones allowed)."""
        return self._thread is not None and threading.current_thread() is self._thread

    def start(self) -> None:
        if self.running:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._serve, name="graphtop-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                worked = self._step()
            except TensorParallelError as e:  # a rank is gone: nothing can be served any more
                self.last_error = str(e)
                self._fail_running(self.last_error)
                return
            except Exception as e:  # keep serving what can be served; say what broke
                log.exception("engine step failed")
                self.last_error = f"{type(e).__name__}: {e}"
                self._publish(ev.ErrorEvent(message=self.last_error, where="step", fatal=False))
                self._fail_running(self.last_error)
                continue
            if not worked:
                self._wake.wait(IDLE_WAIT_S)
                self._wake.clear()
