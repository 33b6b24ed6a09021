"""The engine: one object that owns its parts and delegates its public methods to them.

What callers ask (``api/requests.py``: submit, generate, cancel), how they steer it while it serves
(``api/controls.py``: recapture, parity pacing, waiting for capture) and how it steps and stops
(``step/serving.py``: step, the background thread, close, shutdown, a step that raised) are parts,
built in order by ``lifecycle/build.py``. The step loop's parts are elsewhere, one concept each: the
step loop (``step/loop.py``), command application (``step/apply.py``), the requests in flight
(``step/in_flight.py``), output processing (``step/output.py``: stop strings, finish reasons), what the
engine publishes (``step/events.py``), the model runner and its graph runners (``graphs/``). No part
imports this module or calls back into the engine.

Threading: ``step()`` is the whole hot loop and runs on one thread (the caller's, or the engine's own
after ``start_background()``). Other threads talk to it only through the command queue drained
between steps (submit, cancel, recapture) and read results through thread-safe ``RequestHandle``s and
the event bus. The engine publishes events without blocking and without extra device syncs.

Startup: the engine serves from the moment the model is loaded. The constructor starts the graph
capture and returns; the step loop captures between steps (flat out while idle), each bucket serves
the moment it is captured, and until then a step runs eagerly with ``FallbackReason.NOT_YET_CAPTURED``.
``wait_for_capture()`` waits for every graph; ``EngineConfig.capture_before_serving`` makes the
constructor capture everything before it returns (benchmarks).
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence, Union

from .config import EngineConfig
from .device import resolve_device
from .distributed.group import TensorParallelGroup
from .errors import EngineError, TensorParallelError
from .lifecycle.build import EngineParts, build_parts
from .lifecycle.info import EngineInfo
from .lifecycle.loading import loading
from .lifecycle.telemetry_link import EngineLink, serve_telemetry
from .prompts import Prompt
from .request import RequestHandle
from .sampling_params import SamplingParams
from .telemetry.bus import EventBus
from .telemetry.capture import BucketCost

__all__ = ["Engine", "EngineError", "EngineInfo", "TensorParallelError", "resolve_device"]


def _publishing(parts: EngineParts) -> bool:
    """Whether the engine of ``parts`` still publishes on its bus (the bus's claim holds until it is closed)."""
    return not parts.serving.closed


class Engine:
    """An in-process inference engine for one model (see the module docstring); ``from_pretrained``
    builds one from a checkpoint folder. Each of its parts (``EngineParts``) is an attribute of the same
    name: ``engine.pool``, ``engine.scheduler``, ``engine.model_runner``, ``engine.loop``, ..."""

    def __init__(
        self,
        checkpoint: Any,
        config: EngineConfig,
        bus: Optional[EventBus] = None,
        *,
        demo: bool = False,
        tp: Optional[TensorParallelGroup] = None,
    ):
        """``tp``: the tensor-parallel group (``from_pretrained`` starts it when ``config.tp_size`` > 1);
        ``checkpoint`` is then rank 0's shard."""
        if (tp.size if tp is not None else 1) != config.tp_size:
            raise EngineError(f"tp_size={config.tp_size} needs Engine.from_pretrained (it starts the worker ranks)")
        bus = bus if bus is not None else EventBus()
        bus.check_unclaimed()  # before anything is built or published (claimed once built, below)
        parts = build_parts(checkpoint, config, bus, demo, tp)
        for f in fields(parts):
            setattr(self, f.name, getattr(parts, f.name))
        self.parts = parts
        self.background = parts.serving.background
        bus.claim(parts, _publishing)

    @classmethod
    def from_pretrained(
        cls,
        path: Union[str, Path, None],
        config: Optional[EngineConfig] = None,
        bus: Optional[EventBus] = None,
        **overrides: Any,
    ) -> "Engine":
        """Load a Hugging Face checkpoint folder (``None``: the built-in demo model) and get ready.

        Keyword overrides set EngineConfig fields, e.g. ``device="cuda", dtype="bfloat16"``.
        """
        with loading(path, config, bus, overrides) as loaded:
            return cls(loaded.checkpoint, loaded.config, loaded.bus, demo=loaded.demo, tp=loaded.tp)

    # --- what callers ask (api/requests.py) ------------------------------------------------------
    def submit(
        self,
        prompt: Prompt,
        params: Optional[SamplingParams] = None,
        *,
        chat: bool = False,
        request_id: Optional[str] = None,
    ) -> RequestHandle:
        """Queue a prompt (text, token ids, or a conversation: ``[{"role": "user", "content": ...}, ...]``,
        which always goes through the chat template; ``chat`` sends text through it). Thread-safe; returns
        at once with a streaming handle.

        A prompt that can never be served (empty, past the context or the KV pool, ids outside the
        vocabulary, in the prompt or in the params' logit_bias and stop_token_ids, a conversation for a
        model without a chat template) comes back as a finished
        ``rejected`` handle; text too long for the context by its bytes alone is rejected without being
        tokenized. A wrong type is a TypeError, a malformed conversation a ValueError; a request id that a
        request in flight already uses finishes the new one as ``rejected`` (cancel goes by id).
        """
        return self.requests.submit(prompt, params, chat=chat, request_id=request_id)

    def generate(
        self, prompts: Iterable[Union[str, Sequence[int]]], params: Optional[SamplingParams] = None
    ) -> list[RequestHandle]:
        """Submit all prompts at once (one continuous batch) and serve them to completion. Every prompt
        is checked before any is submitted: a wrong type refuses the whole call, serving none."""
        return self.requests.generate(prompts, params)

    def cancel(self, request_id: str) -> None:
        """Cancel the request in flight with this id (none: nothing happens). Thread-safe."""
        self.requests.cancel(request_id)

    def cancel_handle(self, handle: RequestHandle) -> None:
        self.serving.cancel_handle(handle)

    # --- how callers steer it (api/controls.py) ---------------------------------------------------
    def recapture(
        self,
        decode_bs: Optional[Sequence[int]] = None,
        prefill_num_tokens: Optional[Sequence[int]] = None,
        *,
        cause: str = "manual",
        detail: str = "",
    ) -> None:
        """Replace the captured graphs at the next step boundary; in-flight requests continue. ``cause``
        (``manual``, ``auto_tune``) and ``detail`` go into the ``recapture_requested`` event."""
        self.controls.recapture(decode_bs, prefill_num_tokens, cause=cause, detail=detail)

    def set_parity_every(self, every: int) -> None:
        """Check one graph step in ``every`` against an eager re-run (0: off), from the next step on;
        thread-safe. A problem (too little free KV for the scratch pages) is an ``error`` event."""
        self.controls.set_parity_every(every)

    @property
    def parity_every(self) -> int:
        return self.controls.parity_every

    def wait_for_capture(self, timeout: Optional[float] = None) -> bool:
        """Block until every graph asked for so far (the first capture, and any recapture requested
        before this call) is captured or failed. With the background thread this waits; otherwise it
        drives ``step()`` itself (requests in flight are served meanwhile). False on timeout; an
        EngineError if the engine is (or gets) closed. ``timeout`` None or ``inf`` waits forever; NaN is a
        ValueError (``engine/arguments.py``)."""
        return self.controls.wait_for_capture(timeout)

    def serve_telemetry(self, address: str = "ipc", *, runtime_dir: Any = None, server: Any = None) -> Any:
        """Serve this engine's events on an endpoint that viewers attach to (``graphtop attach``,
        ``graphtop ps``) and take their commands back. ``address``: "ipc" (a private Unix socket) or
        "tcp://HOST:PORT" (token-protected). Returns the ``TelemetryServer``; ``close()`` ends it."""
        self.serving.check_open()
        current = self.serving.telemetry
        if current is not None and not current.closed:
            raise EngineError(f"this engine already serves telemetry at {current.endpoint}; close that server first")
        self.serving.telemetry = serve_telemetry(
            self.viewer_link(), self.bus, address, runtime_dir=runtime_dir, server=server
        )
        return self.serving.telemetry

    def viewer_link(self) -> EngineLink:
        """What a viewer of this engine reaches (its state events, requests and controls): the telemetry
        endpoint serves it, and an in-process watcher (auto-tune) reads the state a late viewer gets."""
        return EngineLink(self.info, self.tokenizer, self.model_runner, self.events, self.requests, self.controls)

    @property
    def telemetry(self) -> Any:
        """The ``TelemetryServer`` of ``serve_telemetry()``, if any (closed with the engine)."""
        return self.serving.telemetry

    @telemetry.setter
    def telemetry(self, server: Any) -> None:
        self.serving.telemetry = server

    # --- how it steps and stops (step/serving.py) --------------------------------------------
    def step(self) -> bool:
        """Run one scheduled forward (see ``StepLoop.step``). Returns False when there was nothing to do.

        With tensor parallelism a failed rank (or a step that failed half-way) raises
        ``TensorParallelError``: fatal, its message one line. While the background thread serves, it
        alone steps: a second caller would interleave with it mid-step (EngineError). Callers on several
        threads take turns. A closed engine has nothing to do (False).

        A step that raises (a bug, a device error, Ctrl-C) may leave its batch half-built: the requests
        in flight then finish ``cancelled`` with the reason as their error, an ``error`` event says what
        broke, the exception goes on to the caller, and the engine serves what comes next."""
        return self.serving.step()

    def run_until_idle(self) -> None:
        """Step until nothing is left to do: every request served, and any pending capture finished.
        With the background thread serving, wait until it finds nothing to do instead, as
        ``run_until_done`` and ``generate`` wait (stepping there would be refused); should it stop first
        (``close``, ``shutdown``), the steps left are run here."""
        self.serving.run_until_idle()

    def run_until_done(self, handles: Iterable[RequestHandle]) -> None:
        """Step until every one of ``handles`` has finished (with the background thread serving: wait for
        them); a capture still pending carries on at later steps (or ``wait_for_capture``)."""
        self.serving.run_until_done(handles)

    def refuse_inside_step(self, what: str) -> None:
        self.serving.refuse_inside_step(what)

    @property
    def background_running(self) -> bool:
        return self.serving.background_running

    def start_background(self) -> None:
        """Serve on the engine's own thread from now on. Refused inside a step (a callback): the caller
        driving that step would find its next step refused half-way through its generate."""
        self.serving.start_background()

    def shutdown(self, timeout: float = 10.0) -> bool:
        """Stop the background thread; False if its step outlasted ``timeout`` (it stops after it)."""
        return self.serving.shutdown(timeout)

    def close(self, reason: str = "engine closed") -> None:
        """Stop serving and give device memory back (graphs, KV pool) without waiting for the GC;
        requests still in flight finish with ``reason`` as their error. Stops the worker ranks.
        Waits for a step in flight on another thread; from a callback inside a step, closes once that
        step is over. Idempotent."""
        self.serving.close(reason)

    @property
    def unavailable(self) -> Optional[str]:
        """Why the engine takes no more work (closed, or its tensor-parallel group failed), in one line;
        None while it does. What a server's health check asks, without submitting anything."""
        return self.serving.unavailable

    @property
    def last_error(self) -> Optional[str]:
        """Why the last step that raised failed (the engine serves what comes next after it)."""
        return self.serving.last_error

    # --- what the engine reports ---------------------------------------------------------------
    @property
    def capture_pending(self) -> bool:
        """Graphs are still being captured (between steps); steps whose bucket is not captured yet run
        eagerly. Read from another thread, it is a snapshot."""
        return self.model_runner.capture_pending

    @property
    def decode_buckets(self) -> list[int]:
        return self.model_runner.decode_buckets

    @property
    def prefill_buckets(self) -> list[int]:
        return self.model_runner.prefill_buckets

    @property
    def kv_capacity_tokens(self) -> int:
        return self.pool.capacity_tokens

    def capture_ledger(self) -> list[BucketCost]:
        return self.model_runner.capture_ledger()

    @property
    def overlap_schedule(self) -> bool:
        return self.loop.overlap_schedule

    @overlap_schedule.setter
    def overlap_schedule(self, on: bool) -> None:
        """May be switched between steps."""
        if not isinstance(on, bool):
            raise TypeError(f"overlap_schedule must be True or False, got {type(on).__name__}")
        self.loop.overlap_schedule = on

    @property
    def overlapped_steps(self) -> int:
        """Steps launched before the previous step was read back (the overlap schedule at work)."""
        return self.loop.overlapped_steps
