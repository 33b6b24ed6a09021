"""How an engine serves and stops: the step and its guard, the background thread, ``close`` (device
memory back, requests in flight finished), ``shutdown`` (the background thread only), and what a step
that raised leaves behind (its requests finished, a failed tensor-parallel group refusing all further
work).

A part the ``Engine`` (engine/engine.py) owns and delegates to; request handles and the background
thread drive steps through it, never through the engine. Closing, failing and queueing a submit take
turns on ``lifecycle``, so a submit is either queued before the queue is drained (and finished there) or
refused: never lost.
"""

from __future__ import annotations

import threading
from typing import Any, Iterable, Optional

import torch

from ..errors import EngineError, TensorParallelError
from ..graphs.model_runner import ModelRunner
from ..kv_pool import KVPool
from ..parity.checker import ParityChecker
from ..request import FinishReason, RequestHandle
from ..scheduler import Scheduler
from ..telemetry import events as ev
from ..telemetry.bus import EventBus
from .background import BackgroundServer
from .cleanup import DeferredInterrupts
from .commands import AwaitCapture, Cancel, CommandQueue, Submit
from .guard import StepGuard
from .in_flight import RequestsInFlight
from .loop import StepLoop
from .output import OutputProcessor


class Serving:
    def __init__(
        self,
        tp: Any,
        device: torch.device,
        bus: EventBus,
        attention: Any,
        pool: KVPool,
        scheduler: Scheduler,
        model_runner: ModelRunner,
        parity: ParityChecker,
        output: OutputProcessor,
        loop: StepLoop,
        commands: CommandQueue,
        in_flight: RequestsInFlight,
    ) -> None:
        """``tp``: the tensor-parallel group, or None."""
        self.tp = tp
        self.device = device
        self.bus = bus
        self.attention = attention
        self.pool = pool
        self.scheduler = scheduler
        self.model_runner = model_runner
        self.parity = parity
        self.output = output
        self.loop = loop
        self.commands = commands
        self.in_flight = in_flight
        self.background = BackgroundServer(self.step, commands.wake, lambda: self.close("the program exited"))
        self.telemetry: Any = None  # the TelemetryServer of Engine.serve_telemetry(), if any
        self.guard = StepGuard()
        self.lifecycle = threading.Lock()  # closing, and queueing a submit, are one or the other first
        self.closed = False
        self.failure: Optional[str] = None  # why the engine failed for good (its tensor-parallel group)
        self._close_after_step: Optional[str] = None  # close() called from a callback inside a step
        self.last_error: Optional[str] = None  # why the last step that raised failed

    # --- what a handle needs (request.RequestOwner) -------------------------------------------------
    @property
    def background_running(self) -> bool:
        return self.background.running

    def refuse_inside_step(self, what: str) -> None:
        """An EngineError if the calling thread is inside a step (an ``on_update`` callback, on the
        background thread or the caller's): whatever would wait on the engine there waits on itself.
        The one check for every waiting call, the engine's and ``RequestHandle``'s (``StepGuard``); the
        serving thread runs no caller code outside its steps, so it is covered too."""
        self.guard.refuse_inside(what)

    def cancel_handle(self, handle: RequestHandle) -> None:
        """``RequestHandle.cancel``: cancels that handle's request only, never a newer one with its id."""
        self.commands.put(Cancel(handle.request_id, handle))

    def check_open(self) -> None:
        """Every entry point that gives the engine work asks this first: a closed engine, or one whose
        tensor-parallel group has failed (no step can run any more), would leave that work unanswered.
        The group's own ``failure`` counts before a step has noticed it."""
        if self.closed:
            raise EngineError("the engine is closed")
        failure = self.failure or (self.tp.failure if self.tp is not None else None)
        if failure:
            raise TensorParallelError(failure)

    @property
    def unavailable(self) -> Optional[str]:
        """Why the engine takes no more work (closed, or its tensor-parallel group failed), in one line;
        None while it does."""
        try:
            self.check_open()
        except EngineError as e:
            return str(e)
        return None

    # --- stepping -------------------------------------------------------------------------------
    def step(self) -> bool:
        """One step of the loop (``Engine.step`` says the rules)."""
        if self.background.running and not self.background.owns_current_thread():
            raise EngineError(
                "the background thread is serving this engine (start_background); "
                "wait on the handles instead of calling step()"
            )
        with self.guard.hold("step()"):
            if self.closed:
                return False
            try:
                if self.tp is None:
                    return self.loop.step()
                with self.tp.step_guard():
                    return self.loop.step()
            except BaseException as e:
                self._fail_step(e)
                raise
            finally:
                reason, self._close_after_step = self._close_after_step, None
                if reason is not None:  # asked from a callback inside this step: the step is over now
                    self._close_locked(reason)

    def run_until_idle(self) -> None:
        """See ``Engine.run_until_idle``."""
        self.refuse_inside_step("run_until_idle()")
        if self.background.running and self.background.wait_idle():
            return
        while self.step():
            pass

    def run_until_done(self, handles: Iterable[RequestHandle]) -> None:
        """See ``Engine.run_until_done``."""
        handles = list(handles)
        for h in handles:
            if not isinstance(h, RequestHandle):
                raise TypeError(f"run_until_done takes the handles submit returned, got {type(h).__name__}")
        self.refuse_inside_step("run_until_done()")
        if self.background.running and not self.background.owns_current_thread():
            for h in handles:  # the background thread serves them: wait instead of stepping
                h.wait()
            return
        remaining = [h for h in handles if not h.finished]
        while remaining:
            if not self.step():
                break
            while remaining and remaining[-1].finished:  # each handle is looked at once it finished
                remaining.pop()

    def start_background(self) -> None:
        """See ``Engine.start_background``."""
        self.refuse_inside_step("start_background()")
        self.check_open()
        self.background.start()

    # --- failing and closing -----------------------------------------------------------------------
    def _fail_step(self, error: BaseException) -> None:
        """A step raised: fail what it may have left half-done (the one home of that clean-up, for the
        caller's steps and the background thread's)."""
        if isinstance(error, KeyboardInterrupt):  # its subclass names the signal (the CLI's Terminated: SIGTERM)
            message = f"interrupted ({type(error).__name__}) during a step"
        else:
            message = f"{type(error).__name__}: {error}".splitlines()[0]
        self.last_error = message
        self.bus.publish(ev.ErrorEvent(message=message, where="step", fatal=False))
        interrupts = DeferredInterrupts()
        self._fail_in_flight(message, interrupts)
        if isinstance(error, TensorParallelError):  # fatal: no later step will apply what is queued
            with self.lifecycle:  # a submit is queued before this (and drained below) or refused after
                self.failure = str(error)
            self._finish_queued(message, interrupts)
        interrupts.reraise()  # a callback's Ctrl-C, once every request has finished

    def _fail_in_flight(self, message: str, interrupts: DeferredInterrupts) -> None:
        """Finish every admitted or waiting request as cancelled with ``message`` (holding the guard);
        a callback that interrupts one finish does not stop the others (engine/step/cleanup.py)."""
        self.loop.discard_in_flight()  # a launched step's tokens are not delivered to failed requests
        for req in list(self.scheduler.running) + list(self.scheduler.waiting):
            with interrupts.deferred():
                self.output.finish(req, FinishReason.CANCELLED, error=message)

    def _finish_queued(self, message: str, interrupts: DeferredInterrupts) -> None:
        """Commands that will never be applied finish too, so that no one waits on them."""
        for command in self.commands.drain():
            if isinstance(command, Submit):
                self.in_flight.ids.release(command.request.request_id)
                with interrupts.deferred():
                    command.request.handle._finish(FinishReason.CANCELLED, message)
            elif isinstance(command, AwaitCapture):
                command.done.set()

    def shutdown(self, timeout: float = 10.0) -> bool:
        """Stop the background thread; False if its step outlasted ``timeout`` (it stops after it)."""
        return self.background.stop(timeout)

    def close(self, reason: str = "engine closed") -> None:
        """See ``Engine.close``."""
        if self.guard.inside():
            self._close_after_step = reason
            if self.background.owns_current_thread():
                self.background.stop()  # only asks: the thread stops after this step
            return
        try:
            with self.guard.hold("close()"):
                self._close_locked(reason)
        finally:
            self.background.stop()  # it has seen the engine closed (or sees it at its next step): join it

    def _close_locked(self, reason: str) -> None:
        """Everything is released before a callback's KeyboardInterrupt goes on: ``closed`` is set first,
        so a close cut short could never be repeated."""
        with self.lifecycle:
            if self.closed:
                return
            self.closed = True
        self.background.stop(timeout=0)  # it checks the flag between steps; the guard waits for its step
        if self.telemetry is not None:
            self.telemetry.close()
        interrupts = DeferredInterrupts()
        self._fail_in_flight(reason, interrupts)
        self._finish_queued(reason, interrupts)
        self.parity.close()
        # After a tensor-parallel failure the device may hold a collective that never finishes: no syncs.
        healthy = self.tp is None or self.tp.failure is None
        if self.device.type == "cuda" and healthy:  # a launched step may still be using graphs and pool
            torch.cuda.synchronize(self.device)
        self.model_runner.release()  # every rank's graphs (they hold collectives) before the group goes
        if self.tp is not None:
            self.tp.close()
        release = getattr(self.attention, "release", None)
        if release is not None:
            release()
        self.pool.release()
        if self.device.type == "cuda" and healthy:
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
        interrupts.reraise()
