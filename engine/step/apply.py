"""Carrying out the engine's commands, on the step loop's thread, between steps.

Every public call that changes what the engine serves (submit, cancel, recapture, parity pacing,
waiting for capture) is queued as a command (engine/step/commands.py) from any thread; the step loop
drains the queue between steps and hands each command here, so the scheduler, the KV pool and the
graphs are only ever touched by the loop's thread.
"""

from __future__ import annotations

from ..graphs.model_runner import ModelRunner
from ..kv_pool import KVPool
from ..parity.checker import ParityChecker
from ..request import FinishReason
from ..telemetry import events as ev
from ..telemetry.bus import EventBus
from .commands import AwaitCapture, Cancel, Command, Recapture, SetParityEvery, Submit
from .events import EngineEvents
from .in_flight import RequestsInFlight
from .output import OutputProcessor


class CommandApplier:
    def __init__(
        self,
        in_flight: RequestsInFlight,
        output: OutputProcessor,
        pool: KVPool,
        model_runner: ModelRunner,
        parity: ParityChecker,
        events: EngineEvents,
        bus: EventBus,
    ) -> None:
        self.in_flight = in_flight
        self.output = output
        self.pool = pool
        self.model_runner = model_runner
        self.parity = parity
        self.events = events
        self.bus = bus

    def apply(self, command: Command) -> None:
        """Carry out one command."""
        if isinstance(command, Submit):
            req = command.request  # its id was claimed at submit: no live request has it (RequestIds)
            self.in_flight.admit(req)
            self.bus.publish(
                ev.RequestQueued(
                    request_id=req.request_id,
                    prompt_tokens=len(req.prompt_ids),
                    max_new_tokens=req.params.max_new_tokens,
                )
            )
        elif isinstance(command, Cancel):
            found = self.in_flight.find(command.request_id)
            if found is not None and (command.handle is None or command.handle is found.handle):
                self.output.finish(found, FinishReason.CANCELLED)
        elif isinstance(command, SetParityEvery):
            problem = self.parity.set_every(command.every, keep_tokens=self.in_flight.longest_context())
            if problem:
                self.bus.publish(ev.ErrorEvent(message=problem, where="parity"))
            self.output.kv_capacity_tokens = self.pool.capacity_tokens  # scratch pages come and go
            self.events.kv(force=True)
        elif isinstance(command, AwaitCapture):
            self.model_runner.notify_when_captured(command.done)
        else:
            assert isinstance(command, Recapture), command
            self.parity.wait_idle()  # capture forbids other CUDA work while it runs
            self.model_runner.recapture(command.decode_bs, command.prefill_num_tokens)
            self.events.memory_ledger()
