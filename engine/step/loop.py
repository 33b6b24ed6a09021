"""The step loop: one scheduled forward per call, on one thread.

Each step applies the commands queued since the last one, schedules a batch, runs it through the
model runner (a graph or eagerly), samples, and hands the tokens to output processing. Under the
overlap schedule (engine/step/overlap.py) a greedy decode step is launched here and read back in the next
call, after that call has launched its own step. Between steps, a pending capture (the first one,
while the engine already serves, or a recapture) captures one more slice of graphs with no step in
flight; an idle engine captures slice after slice, draining commands between slices. Where recordings
ride in-flight steps (``GraphConfig.record_in_flight``) a graph's recording runs right after a step's
launch instead, while that step is on the device (``_ride``), and only warmup forwards stay between steps.
"""

from __future__ import annotations

import time
from typing import Callable, Optional, TypeVar

from ..batch import ForwardBatch
from ..graphs.model_runner import ModelRunner
from ..graphs.runners.base import StepOutput
from ..kv_pool import KVPool
from ..parity.checker import ParityChecker
from ..sampler import PromptRows, Sampled, sample_step
from ..scheduler import Scheduler
from .apply import CommandApplier
from .commands import CommandQueue
from .events import EngineEvents
from .output import OutputProcessor
from .overlap import PLACEHOLDER_TOKEN, InFlightStep, TokenReadback, can_chain, launchable

T = TypeVar("T")

COMPILE_POLL_S = 0.005
"""How long an idle loop naps while its capture waits for kernels to compile (a command waits at most this)."""


class StepLoop:
    def __init__(
        self,
        scheduler: Scheduler,
        pool: KVPool,
        model_runner: ModelRunner,
        output: OutputProcessor,
        events: EngineEvents,
        commands: CommandQueue,
        applier: CommandApplier,
        readback: TokenReadback,
        max_context_len: int,
        overlap_schedule: bool,
        parity: Optional[ParityChecker] = None,
    ):
        """``applier`` carries out each queued command between steps; ``parity`` checks graph steps
        against eager re-runs (engine/parity/checker.py) when switched on."""
        self.scheduler = scheduler
        self.pool = pool
        self.model_runner = model_runner
        self.output = output
        self.events = events
        self.commands = commands
        self.applier = applier
        self.readback = readback
        self.max_context_len = max_context_len
        self.overlap_schedule = overlap_schedule  # may be switched between steps
        self.pending: Optional[InFlightStep] = None  # overlap schedule: a decode step not read back yet
        self.step_no = 0
        self.overlapped_steps = 0  # steps launched before the previous step was read back
        self.parity = parity

    def apply_commands(self) -> None:
        applied = False
        for command in self.commands.drain():
            self.applier.apply(command)
            applied = True
        if applied:  # a cancel on an idle engine has no step after it to publish the freed pool
            self.events.kv()

    def step(self) -> bool:
        """Run one scheduled forward. Returns False when there was nothing to do."""
        if self.parity is not None:
            self.parity.poll()  # a finished check goes out even while the engine idles
        pending, self.pending = self.pending, None
        worked = pending is not None
        if pending is not None and not self.commands.empty():
            # Commands (submit, cancel, recapture) act on an engine with nothing in flight.
            self._complete(pending, placeholders=False)
            pending = None
        self.apply_commands()
        if pending is not None:
            if self.overlap_schedule and can_chain(
                pending, self.scheduler, self.pool, self.max_context_len, self.model_runner.capture_needs_idle
            ):
                for req in pending.batch.requests:  # the token in flight counts for the next step
                    req.output_ids.append(PLACEHOLDER_TOKEN)
                batch = self.scheduler.schedule()
                assert batch is not None and batch.requests == pending.batch.requests
                batch.input_ids_device = pending.tokens_device
                self.overlapped_steps += 1
                t0 = time.perf_counter()
                # a step is in flight: no slice before the launch (a warmup forward needs the device to itself)
                self.pending = self.readback.launch(batch, self._forward(batch, may_capture=False), t0)
                self._ride()
                self._complete(pending, placeholders=True)
                return True
            self._complete(pending, placeholders=False)
        batch = self.scheduler.schedule()
        if batch is None:
            if self.model_runner.capture_pending:  # idle: capture flat out, a slice per call
                self._advance_capture(idle=True)
                if self.model_runner.capture_waiting:  # kernels compile in other processes: do not spin
                    time.sleep(COMPILE_POLL_S)
                return True
            return worked
        t0 = time.perf_counter()
        out = self._forward(batch)
        if self.overlap_schedule and launchable(batch):
            self.pending = self.readback.launch(batch, out, t0)
            self._ride()
            return True
        launch_ms = (time.perf_counter() - t0) * 1e3
        self._ride()
        eos, prompt = self.output.eos_ids, PromptRows.of(out.prompt_logits, batch)
        sampled = self._wait_on_device(lambda: sample_step(out.logits, batch.sample_requests, eos, prompt))
        host_ms = (time.perf_counter() - t0) * 1e3
        self._deliver(batch, out, sampled.tokens, host_ms, sampled=sampled, launch_ms=launch_ms)
        return True

    def discard_in_flight(self) -> None:
        """After a step raised: forget the launched step, and take back the stand-in token a chained
        step appended (its requests are about to finish; their outputs must be real tokens)."""
        self.pending = None
        for req in [*self.scheduler.running, *self.scheduler.waiting]:
            if req.output_ids and req.output_ids[-1] == PLACEHOLDER_TOKEN:
                req.output_ids.pop()

    def _advance_capture(self, *, ride: bool = False, idle: bool = False) -> None:
        if self.model_runner.advance_capture(ride=ride, idle=idle):
            self.events.memory_ledger()

    def _ride(self) -> None:
        """Right after a launch, the step on the device: a graph's recording, where recordings ride
        in-flight steps (its host time is then hidden behind the step's device time, and counted in no
        step's launch time)."""
        if self.model_runner.capture_pending:
            self._advance_capture(ride=True)

    def _forward(self, batch: ForwardBatch, *, may_capture: bool = True) -> StepOutput:
        """Capture a slice first when nothing is in flight (``may_capture``), run the step, and let the
        parity checker see its graph output."""
        if may_capture:
            self._advance_capture()
        out = self.model_runner.forward(batch)
        if self.parity is not None:
            self.parity.after_forward(batch, out, allowed=not self.model_runner.capture_pending)
        return out

    def _complete(self, step: InFlightStep, placeholders: bool) -> None:
        """Read a launched step's tokens back and deliver them."""
        self._deliver(
            step.batch, step.out, self._wait_on_device(step.tokens), step.host_ms, placeholders, launch_ms=step.host_ms
        )

    def _wait_on_device(self, wait: Callable[[], T]) -> T:
        """Block on the device for a step's tokens; a parity check's re-run uses the wait."""
        return wait() if self.parity is None else self.parity.while_device_busy(wait)

    def _deliver(
        self,
        batch: ForwardBatch,
        out: StepOutput,
        tokens: list[int],
        host_ms: float,
        placeholders: bool = False,
        sampled: Optional[Sampled] = None,
        launch_ms: Optional[float] = None,
    ) -> None:
        self.step_no += 1
        self.events.step(self.step_no, batch, out, host_ms, launch_ms)
        if self.parity is not None:
            self.parity.delivered(out, self.step_no)
        if sampled is not None and (sampled.logprobs or sampled.prompt_logprobs):
            self.output.deliver_logprobs(batch, sampled)
        self.output.deliver(batch, tokens, placeholders)
        self.events.kv()
