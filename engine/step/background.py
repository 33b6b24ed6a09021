"""The engine's own serving thread (``Engine.start_background``): step while there is work, sleep on
the command queue's wake event when there is none.

A step that raises must not end serving: the engine has already failed the requests in flight with
the reason (``Engine.step``) and the loop goes on with whatever comes next. Only a tensor-parallel
failure ends it, since no step can run once a rank is gone.

A program may end without closing the engine. The thread is a daemon (it must not keep the program
alive), but a daemon thread still inside a step when Python finalizes is cut off inside torch and the
process aborts ("terminate called without an active exception", exit 134). So while the thread serves,
an atexit hook stops it and closes the engine first; the hook holds only a weak reference (an engine
whose thread was stopped can still be collected) and a stop that joins the thread takes it back.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from typing import Callable, Optional

from ..errors import TensorParallelError

log = logging.getLogger("graphtop.engine")

IDLE_WAIT_S = 0.05  # longest sleep between polls while idle (a command wakes the loop at once)
EXIT_STOP_S = 10.0  # at interpreter exit, how long the step in flight may take to end (exit never hangs)


class BackgroundServer:
    def __init__(self, step: Callable[[], bool], wake: threading.Event, close: Callable[[], None]) -> None:
        """``close``: closes the engine, at interpreter exit once the thread has stopped."""
        self._step, self._wake, self._close = step, wake, close
        self._exit_hook: Optional[Callable[[], None]] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._idle = threading.Condition()
        self._idle_steps = 0  # steps that found nothing to do (wait_idle counts them)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def owns_current_thread(self) -> bool:
        """The caller is the serving thread itself (its own step calls are the only ones allowed)."""
        return self._thread is not None and threading.current_thread() is self._thread

    def start(self) -> None:
        if self.running:
            if not self._stop.is_set():
                return
            assert self._thread is not None
            self._thread.join()  # a stop that timed out: one serving thread, so wait for its step to end
        self._stop.clear()
        self._thread = threading.Thread(target=self._serve, name="graphtop-engine", daemon=True)
        self._thread.start()
        if self._exit_hook is None:
            self._exit_hook = _weakly(self._at_exit)
            atexit.register(self._exit_hook)

    def stop(self, timeout: float = 10.0) -> bool:
        """Ask the thread to stop after its step and wait up to ``timeout``; False if it is still in
        that step (it stops when the step ends; a new ``start`` waits for that). Called from the
        thread itself (a callback), it only asks."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(timeout)
        if thread.is_alive():
            return False
        self._thread = None
        if self._exit_hook is not None:  # nothing left to stop at exit
            atexit.unregister(self._exit_hook)
            self._exit_hook = None
        return True

    def _at_exit(self) -> None:
        if self.stop(EXIT_STOP_S):
            self._close()
        else:  # closing would wait for that step: better an abort than a program that never exits
            log.warning("at exit, the engine's step outlasted %.0f s; the engine was not closed", EXIT_STOP_S)

    def wait_idle(self) -> bool:
        """Block until a step that began after this call found nothing to do (True), or until the thread
        stops (False). The step in flight when it is called may have drained the queue before the
        caller's last submit, so its answer does not count: the second idle step after the call does."""
        with self._idle:
            target = self._idle_steps + 2
            while self._idle_steps < target:
                if self._stop.is_set() or not self.running:
                    return False
                self._wake.set()  # an idle loop looks again at once instead of after IDLE_WAIT_S
                self._idle.wait(IDLE_WAIT_S)
        return True

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                worked = self._step()
            except TensorParallelError:  # a rank is gone: nothing can be served any more
                log.exception("a tensor-parallel rank failed; the background thread stops")
                return
            except Exception:  # the engine failed that step's requests; keep serving what comes next
                log.exception("engine step failed")
                continue
            if not worked:
                with self._idle:
                    self._idle_steps += 1
                    self._idle.notify_all()
                self._wake.wait(IDLE_WAIT_S)
                self._wake.clear()


def _weakly(method: Callable[[], None]) -> Callable[[], None]:
    """``method`` through a weak reference to its object: a no-op once that object is collected."""
    ref = weakref.WeakMethod(method)

    def call() -> None:
        bound = ref()
        if bound is not None:
            bound()

    return call
