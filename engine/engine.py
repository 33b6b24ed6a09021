"""The engine: builds the model's serving parts, takes commands, and runs the step loop.

Lifecycle and commands live here; the parts are elsewhere, one concept each: the step loop
(``step_loop``), output processing (``output``: stop strings, finish reasons), what the engine
publishes (``engine_events``), the model runner and its graph runners (``model_runner``).

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

import logging
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence, Union

import torch

from .attention.base import AttentionShape
from .attention.select import select_attention_backend
from .commands import AwaitCapture, Cancel, Command, CommandQueue, Recapture, SetParityEvery, Submit
from .config import EngineConfig, context_limit
from .step.detokenizer import IncrementalDetokenizer
from .device import resolve_device
from .errors import EngineError
from .errors import TensorParallelError
from .step.background import BackgroundServer
from .step.cleanup import DeferredInterrupts
from .distributed.group import TensorParallelGroup
from .distributed.setup import RankSetup
from .step.events import EngineEvents
from .lifecycle.info import EngineInfo, describe, started_events
from .lifecycle.loading import load_engine
from .kernel_config import resolve_kernel_config
from .graphs.config import resolve_graph_config
from .kv_pool import KVLayout, KVPool
from .memory_plan import MiB, check_graph_buffers_fit, graph_reserve_estimate, plan_kv_pool
from .model_runner import ModelRunner
from .step.output import OutputProcessor
from .step.overlap import TokenReadback
from .parity.checker import ParityChecker, scratch_pages
from .prompt_bytes import PromptByteLimit
from .prompts import Prompt, admission_problem, encode_prompt
from .request import FinishReason, Request, RequestHandle
from .request_ids import RequestIds
from .sampling_params import SamplingParams
from .scheduler import Scheduler, SchedulerConfig
from .step.guard import StepGuard
from .step.loop import StepLoop
from .telemetry import events as ev
from .telemetry.bus import EventBus
from .telemetry.capture import BucketCost
from .telemetry.value_limits import is_unicode
from .timeouts import wait_timeout

__all__ = ["Engine", "EngineError", "EngineInfo", "TensorParallelError", "resolve_device"]

log = logging.getLogger("graphtop.engine")


def _publishing(engine: "Engine") -> bool:
    """Whether ``engine`` still publishes on its bus (the bus's claim holds until it is closed)."""
    return not engine._closed


class Engine:
    def __init__(self, checkpoint: Any, config: EngineConfig, bus: Optional[EventBus] = None, *, demo: bool = False,
                 tp: Optional[TensorParallelGroup] = None):
        """``tp``: the tensor-parallel group (``from_pretrained`` starts it when ``config.tp_size`` > 1);
        ``checkpoint`` is then rank 0's shard."""
        if (tp.size if tp is not None else 1) != config.tp_size:
            raise EngineError(f"tp_size={config.tp_size} needs Engine.from_pretrained (it starts the worker ranks)")
        self.tp = tp
        self.config = config
        self.bus = bus if bus is not None else EventBus()
        self.bus.check_unclaimed()  # before anything is built or published (claimed once built, below)
        self.checkpoint = checkpoint
        self.model = checkpoint.model
        self.tokenizer = checkpoint.tokenizer
        self.spec = spec = checkpoint.spec
        self.device = next(self.model.parameters()).device
        self.dtype = next(self.model.parameters()).dtype
        self.demo = demo
        self.kernels = resolve_kernel_config(config.kernels)

        self.max_context_len = context_limit(config.max_context_len, spec.max_position_embeddings)
        self.prompt_limit = PromptByteLimit(self.tokenizer, self.max_context_len)  # too long by its bytes alone
        local = self.model.spec  # this rank's heads and KV heads (the whole model's without tensor parallelism)
        layout = KVLayout(local.num_layers, local.num_kv_heads, local.head_dim, self.dtype)
        plan_inputs = dict(
            bytes_per_token=layout.bytes_per_token,
            page_size=config.page_size,
            mem_fraction_static=config.mem_fraction_static,
            cpu_kv_budget_bytes=config.cpu_kv_budget_mb * MiB,
            activation_reserve_bytes=config.activation_reserve_mb * MiB,
            graph_reserve_bytes=graph_reserve_estimate(self.device),
            max_total_tokens=config.max_total_tokens,
        )
        # a packed skinny GEMM's weight copies come on top of the checkpoint's bytes (KernelConfig)
        copies = self.model.packed_copy_bytes() if self.kernels.skinny_packed else 0
        weights_bytes = checkpoint.weights_bytes + copies
        self.memory_plan = plan_kv_pool(device=self.device, weights_bytes=weights_bytes, **plan_inputs)
        if tp is not None:
            self.memory_plan = tp.plan_kv_pool(plan_inputs, self.memory_plan)
        self.pool = KVPool(layout, self.memory_plan.num_pages, config.page_size, self.device)
        self.max_running = min(config.max_running_requests or 256, self.pool.capacity_pages)
        shape = AttentionShape(local.num_heads, local.num_kv_heads, local.head_dim, local.softmax_scale)
        self.attention, attention_note = select_attention_backend(
            config.attention_backend, self.pool, shape, self.device, self.kernels
        )
        attention_note += self._enable_model_kernels()
        if config.overlap_schedule:
            attention_note += " · overlap schedule"
        self.scheduler = Scheduler(self.pool, SchedulerConfig(config.chunked_prefill_size, self.max_running))
        resolved = resolve_graph_config(
            config.graphs,
            max_running=self.max_running,
            pool_tokens=self.pool.capacity_tokens,
            chunked_prefill_size=config.chunked_prefill_size,
            cuda_graphs_available=self.device.type == "cuda",
            attention_supports_decode_graph=self.attention.supports_decode_graph,
        )
        max_pages = self.pool.pages_for(self.max_context_len)
        if resolved.available:  # static buffers that would not fit: refused before allocating them
            check_graph_buffers_fit(self.model.spec, self.dtype, self.device, max(resolved.decode_bs, default=0),
                                    max_pages, max(resolved.prefill_num_tokens, default=0))
        runner_args = (self.model, self.attention, self.device, resolved, max_pages, self.bus.publish)
        if tp is None:
            self.model_runner = ModelRunner(*runner_args, freeze_gc=config.graphs.freeze_gc)
        else:
            setup = RankSetup(self.attention.name, self.kernels, config.fused_kernels, config.fused_gemv_max_rows,
                              resolved, max_pages, config.graphs.freeze_gc)
            self.model_runner = tp.model_runner(*runner_args, freeze_gc=config.graphs.freeze_gc, setup=setup)
        self.events = EngineEvents(self.bus, self.device, self.scheduler, self.pool, self.memory_plan,
                                   self.model_runner, self.max_running)
        self.parity = ParityChecker(self.model, self.attention, self.pool, self.device, self.bus.publish,
                                    scratch_pages=scratch_pages(self.model_runner, self.pool, self.max_running),
                                    tolerance=config.parity_tolerance)
        self.info = describe(checkpoint, attention_note, self.attention, self.model_runner, self.pool,
                             self.max_running, self.max_context_len, demo, config.tp_size)
        self._publish_started()
        if config.parity_every and tp is not None:
            raise EngineError("parity checks do not run with tensor parallelism (--tp > 1)")
        self.model_runner.start_capture()
        if config.capture_before_serving:
            self.model_runner.advance_capture(to_the_end=True)
        if config.parity_every:  # before anything reads the pool's capacity: scratch comes out of it
            problem = self.parity.set_every(config.parity_every)
            if problem:
                raise EngineError(problem)
        self.events.memory_ledger()
        self.events.kv(force=True)

        self.commands = CommandQueue()
        self._ids = RequestIds()
        self._by_id: dict[str, Request] = {}
        self.output = OutputProcessor(self.tokenizer, frozenset(spec.eos_token_ids), self.max_context_len,
                                      self.pool.capacity_tokens, self._release, self.bus.publish)
        self.loop = StepLoop(self.scheduler, self.pool, self.model_runner, self.output, self.events, self.commands,
                             self._apply, TokenReadback(self.device, self.max_running), self.max_context_len,
                             config.overlap_schedule, self.parity)
        self.background = BackgroundServer(self.step, self.commands.wake, lambda: self.close("the program exited"))
        self.telemetry: Any = None  # the TelemetryServer of serve_telemetry(), if any
        self._guard = StepGuard()
        self._lifecycle = threading.Lock()  # closing, and queueing a submit, are one or the other first
        self._closed = False
        self._failure: Optional[str] = None  # why the engine failed for good (its tensor-parallel group)
        self._close_after_step: Optional[str] = None  # close() called from a callback inside a step
        self._last_error: Optional[str] = None
        self.bus.claim(self, _publishing)

    # --- construction -------------------------------------------------------------------------
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
        return load_engine(cls, path, config, bus, overrides)

    def _enable_model_kernels(self) -> str:
        """Switch the model to its fused kernels where the device allows; the note says what happened."""
        k = self.kernels
        if not (self.config.fused_kernels and
                self.model.enable_fused_kernels(self.config.fused_gemv_max_rows, gemv=k.gemv_layers, pdl=k.pdl,
                                                skinny=k.skinny_layers, packed=k.skinny_packed)):
            return ""
        note = " · model kernels: triton-fused"
        if self.model.fused_gemv_rows:
            note += f" (fused-GEMV layers for steps of <= {self.model.fused_gemv_rows} tokens)"
        if k.skinny_packed:  # asked for: say where it took effect, and what it holds
            rows = self.model.packed_rows()
            note += (f" · packed skinny weights for steps of {', '.join(f'{a}-{b}' for a, b in rows)} tokens"
                     f" ({self.model.packed_bytes() / 2**30:.1f} GiB)" if rows
                     else " · packed skinny weights: none for this shape")
        return note

    def _publish_started(self) -> None:
        for event in started_events(self.info, self.model_runner.resolved):
            self.bus.publish(event)

    # --- public API ----------------------------------------------------------------------------
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
        vocabulary, a conversation for a model without a chat template) comes back as a finished
        ``rejected`` handle; text too long for the context by its bytes alone is rejected without being
        tokenized. A wrong type is a TypeError, a malformed conversation a ValueError; a request id that a
        request in flight already uses finishes the new one as ``rejected`` (cancel goes by id).
        """
        self._check_open()
        params = self._check_params(params)
        if request_id is not None and not isinstance(request_id, str):
            raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
        if request_id is not None and not is_unicode(request_id):  # every event of it would poison a trace
            raise ValueError(f"request_id is not valid Unicode (a lone surrogate): {request_id!r}")
        text, ids = encode_prompt(self.tokenizer, prompt, chat, self.prompt_limit)
        return self._submit_encoded(text, ids, params, request_id)

    @staticmethod
    def _check_params(params: Optional[SamplingParams]) -> SamplingParams:
        if params is not None and not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        return params or SamplingParams()

    def _submit_encoded(self, text: str, ids: list[int], params: SamplingParams,
                        request_id: Optional[str]) -> RequestHandle:
        rid = self._ids.claim(request_id)
        if rid is None:  # request_id is not None here: only a wanted id can be taken
            problem = f"request id {request_id!r} is already used by a request in flight"
            handle = RequestHandle(str(request_id), self, text, ids)
            handle._finish(FinishReason.REJECTED, problem)
            # an error, not a request_finished: under that id every reader of the stream (the endpoint's
            # snapshot, the dashboard, a trace's latencies) would finish the live request
            self.bus.publish(ev.ErrorEvent(message=f"a submit was rejected: {problem}", where="submit"))
            return handle
        handle = RequestHandle(rid, self, text, ids)
        problem = admission_problem(ids, self.max_context_len, self.pool.capacity_tokens, self.spec.vocab_size)
        if problem:
            self._ids.release(rid)
            handle._finish(FinishReason.REJECTED, problem)
            self.bus.publish(ev.RequestFinished(request_id=rid, output_tokens=0, finish_reason="rejected",
                                                error=problem))
            return handle
        req = Request(rid, list(ids), params, handle)
        if params.detokenize:
            req.detok = IncrementalDetokenizer(self.tokenizer)
        with self._lifecycle:  # queued before a close or a failure drains the queue, or refused: never lost
            try:
                self._check_open()
            except EngineError:
                self._ids.release(rid)
                raise
            self.commands.put(Submit(req))
        return handle

    def generate(
        self, prompts: Iterable[Union[str, Sequence[int]]], params: Optional[SamplingParams] = None
    ) -> list[RequestHandle]:
        """Submit all prompts at once (one continuous batch) and serve them to completion. Every prompt
        is checked before any is submitted: a wrong type refuses the whole call, serving none."""
        if isinstance(prompts, str):
            raise TypeError("generate takes a list of prompts; for one prompt pass [prompt], or use submit")
        self._check_open()
        self.refuse_inside_step("generate()")
        params = self._check_params(params)
        encoded = [encode_prompt(self.tokenizer, p, False, self.prompt_limit) for p in prompts]
        handles = [self._submit_encoded(text, ids, params, None) for text, ids in encoded]
        if self.background_running:
            for h in handles:
                h.wait()
        else:
            self.run_until_done(handles)
        return handles

    def cancel(self, request_id: str) -> None:
        """Cancel the request in flight with this id (none: nothing happens). Thread-safe."""
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
        self.commands.put(Cancel(request_id))

    def cancel_handle(self, handle: RequestHandle) -> None:
        """``RequestHandle.cancel``: cancels that handle's request only, never a newer one with its id."""
        self.commands.put(Cancel(handle.request_id, handle))

    def recapture(
        self, decode_bs: Optional[Sequence[int]] = None, prefill_num_tokens: Optional[Sequence[int]] = None
    ) -> None:
        """Replace the captured graphs at the next step boundary; in-flight requests continue."""
        self._check_open()  # a closed engine would publish a request that nothing ever answers
        cmd = Recapture(tuple(decode_bs) if decode_bs is not None else None,
                        tuple(prefill_num_tokens) if prefill_num_tokens is not None else None)
        self.bus.publish(ev.RecaptureRequested(decode_bs=cmd.decode_bs, prefill_num_tokens=cmd.prefill_num_tokens))
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
        from .lifecycle.telemetry_link import serve_telemetry

        self._check_open()
        if self.telemetry is not None and not self.telemetry.closed:
            raise EngineError(f"this engine already serves telemetry at {self.telemetry.endpoint}; "
                              "close that server first")
        self.telemetry = serve_telemetry(self, address, runtime_dir=runtime_dir, server=server)
        return self.telemetry

    def wait_for_capture(self, timeout: Optional[float] = None) -> bool:
        """Block until every graph asked for so far (the first capture, and any recapture requested
        before this call) is captured or failed. With the background thread this waits; otherwise it
        drives ``step()`` itself (requests in flight are served meanwhile). False on timeout; an
        EngineError if the engine is (or gets) closed. ``timeout`` None or ``inf`` waits forever; NaN is a
        ValueError (``engine/timeouts.py``)."""
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

    # --- the loop and its commands ---------------------------------------------------------------
    def run_until_idle(self) -> None:
        """Step until nothing is left to do: every request served, and any pending capture finished.
        With the background thread serving, wait until it finds nothing to do instead, as
        ``run_until_done`` and ``generate`` wait (stepping there would be refused); should it stop first
        (``close``, ``shutdown``), the steps left are run here."""
        self.refuse_inside_step("run_until_idle()")
        if self.background.running and self.background.wait_idle():
            return
        while self.step():
            pass

    def run_until_done(self, handles: Iterable[RequestHandle]) -> None:
        """Step until every one of ``handles`` has finished (with the background thread serving: wait for
        them); a capture still pending carries on at later steps (or ``wait_for_capture``)."""
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

    def refuse_inside_step(self, what: str) -> None:
        """An EngineError if the calling thread is inside a step (an ``on_update`` callback, on the
        background thread or the caller's): whatever would wait on the engine there waits on itself.
        The one check for every waiting call, the engine's and ``RequestHandle``'s (``StepGuard``); the
        serving thread runs no caller code outside its steps, so it is covered too."""
        self._guard.refuse_inside(what)

    def step(self) -> bool:
        """Run one scheduled forward (see ``StepLoop.step``). Returns False when there was nothing to do.

        With tensor parallelism a failed rank (or a step that failed half-way) raises
        ``TensorParallelError``: fatal, its message one line. While the background thread serves, it
        alone steps: a second caller would interleave with it mid-step (EngineError). Callers on several
        threads take turns. A closed engine has nothing to do (False).

        A step that raises (a bug, a device error, Ctrl-C) may leave its batch half-built: the requests
        in flight then finish ``cancelled`` with the reason as their error, an ``error`` event says what
        broke, the exception goes on to the caller, and the engine serves what comes next."""
        if self.background.running and not self.background.owns_current_thread():
            raise EngineError("the background thread is serving this engine (start_background); "
                              "wait on the handles instead of calling step()")
        with self._guard.hold("step()"):
            if self._closed:
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

    def _apply(self, command: Command) -> None:
        """Carry out one command, on the step loop's thread, between steps."""
        if isinstance(command, Submit):
            req = command.request  # its id was claimed at submit: no live request has it (RequestIds)
            self._by_id[req.request_id] = req
            self.scheduler.add(req)
            self.bus.publish(ev.RequestQueued(request_id=req.request_id, prompt_tokens=len(req.prompt_ids),
                                              max_new_tokens=req.params.max_new_tokens))
        elif isinstance(command, Cancel):
            found = self._by_id.get(command.request_id)
            if found is not None and (command.handle is None or command.handle is found.handle):
                self.output.finish(found, FinishReason.CANCELLED)
        elif isinstance(command, SetParityEvery):
            keep = max((len(r.prompt_ids) + len(r.output_ids) + 1 for r in self._by_id.values()), default=0)
            problem = self.parity.set_every(command.every, keep_tokens=keep)
            if problem:
                self.bus.publish(ev.ErrorEvent(message=problem, where="parity"))
            self.output.kv_capacity_tokens = self.pool.capacity_tokens  # scratch pages come and go
            self.events.kv(force=True)
        elif isinstance(command, AwaitCapture):
            self.model_runner.notify_when_captured(command.done)
        else:
            self.parity.wait_idle()  # capture forbids other CUDA work while it runs
            self.model_runner.recapture(command.decode_bs, command.prefill_num_tokens)
            self.events.memory_ledger()

    def _release(self, req: Request) -> None:
        self.scheduler.finish(req)
        self._by_id.pop(req.request_id, None)
        self._ids.release(req.request_id)

    # --- background thread ---------------------------------------------------------------------
    @property
    def background_running(self) -> bool:
        return self.background.running

    def start_background(self) -> None:
        """Serve on the engine's own thread from now on. Refused inside a step (a callback): the caller
        driving that step would find its next step refused half-way through its generate."""
        self.refuse_inside_step("start_background()")
        self._check_open()
        self.background.start()

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
