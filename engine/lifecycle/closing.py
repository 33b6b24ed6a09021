"""How an engine stops: ``close`` (device memory back, requests in flight finished), ``shutdown`` (the
background thread only), and what a step that raised leaves behind (its requests finished, a failed
tensor-parallel group refusing all further work).

A mixin of ``Engine`` (engine/engine.py): the engine holds the state these methods use, annotated
below. Closing, failing and queueing a submit take turns on ``_lifecycle``, so a submit is either
queued before the queue is drained (and finished there) or refused: never lost.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

import torch

from ..errors import EngineError, TensorParallelError
from ..graphs.model_runner import ModelRunner
from ..kv_pool import KVPool
from ..parity.checker import ParityChecker
from ..request import FinishReason, RequestIds
from ..scheduler import Scheduler
from ..step.background import BackgroundServer
from ..step.cleanup import DeferredInterrupts
from ..step.commands import AwaitCapture, CommandQueue, Submit
from ..step.guard import StepGuard
from ..step.loop import StepLoop
from ..step.output import OutputProcessor
from ..telemetry import events as ev
from ..telemetry.bus import EventBus


class Closing:
    # the engine's, set in Engine.__init__
    tp: Any
    device: torch.device
    bus: EventBus
    attention: Any
    pool: KVPool
    scheduler: Scheduler
    model_runner: ModelRunner
    parity: ParityChecker
    output: OutputProcessor
    loop: StepLoop
    commands: CommandQueue
    background: BackgroundServer
    telemetry: Any
    _ids: RequestIds
    _guard: StepGuard
    _lifecycle: threading.Lock
    _closed: bool
    _failure: Optional[str]
    _close_after_step: Optional[str]
    _last_error: Optional[str]

    def _check_open(self) -> None:
        """Every entry point that gives the engine work asks this first: a closed engine, or one whose
        tensor-parallel group has failed (no step can run any more), would leave that work unanswered.
        The group's own ``failure`` counts before a step has noticed it."""
        if self._closed:
            raise EngineError("the engine is closed")
        failure = self._failure or (self.tp.failure if self.tp is not None else None)
        if failure:
            raise TensorParallelError(failure)

    @property
    def unavailable(self) -> Optional[str]:
        """Why the engine takes no more work (closed, or its tensor-parallel group failed), in one line;
        None while it does. What a server's health check asks, without submitting anything."""
        try:
            self._check_open()
        except EngineError as e:
            return str(e)
        return None

    @property
    def last_error(self) -> Optional[str]:
        """Why the last step that raised failed (the engine serves what comes next after it)."""
        return self._last_error

    def _fail_step(self, error: BaseException) -> None:
        """A step raised: fail what it may have left half-done (the one home of that clean-up, for the
        caller's steps and the background thread's)."""
        if isinstance(error, KeyboardInterrupt):  # its subclass names the signal (the CLI's Terminated: SIGTERM)
            message = f"interrupted ({type(error).__name__}) during a step"
        else:
            message = f"{type(error).__name__}: {error}".splitlines()[0]
        self._last_error = message
        self.bus.publish(ev.ErrorEvent(message=message, where="step", fatal=False))
        interrupts = DeferredInterrupts()
        self._fail_in_flight(message, interrupts)
        if isinstance(error, TensorParallelError):  # fatal: no later step will apply what is queued
            with self._lifecycle:  # a submit is queued before this (and drained below) or refused after
                self._failure = str(error)
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
                self._ids.release(command.request.request_id)
                with interrupts.deferred():
                    command.request.handle._finish(FinishReason.CANCELLED, message)
            elif isinstance(command, AwaitCapture):
                command.done.set()

    def shutdown(self, timeout: float = 10.0) -> bool:
        """Stop the background thread; False if its step outlasted ``timeout`` (it stops after it)."""
        return self.background.stop(timeout)

    def close(self, reason: str = "engine closed") -> None:
        """Stop serving and give device memory back (graphs, KV pool) without waiting for the GC;
        requests still in flight finish with ``reason`` as their error. Stops the worker ranks.
        Waits for a step in flight on another thread; from a callback inside a step, closes once that
        step is over. Idempotent."""
        if self._guard.inside():
            self._close_after_step = reason
            if self.background.owns_current_thread():
                self.background.stop()  # only asks: the thread stops after this step
            return
        try:
            with self._guard.hold("close()"):
                self._close_locked(reason)
        finally:
            self.background.stop()  # it has seen the engine closed (or sees it at its next step): join it

    def _close_locked(self, reason: str) -> None:
        """Everything is released before a callback's KeyboardInterrupt goes on: ``_closed`` is set first,
        so a close cut short could never be repeated."""
        with self._lifecycle:
            if self._closed:
                return
            self._closed = True
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
