"""The engine: builds the model's serving parts, takes commands, and runs the step loop.

Construction and the step loop live here; the public methods are grouped by concern in mixins: what
callers ask (``api/requests.py``: submit, generate, cancel), how they steer it while it serves
(``api/controls.py``: recapture, parity pacing, telemetry, waiting for capture) and how it stops
(``lifecycle/closing.py``: close, shutdown, a step that raised). The parts are elsewhere, one concept
each: the step loop (``step/loop.py``), output processing (``step/output.py``: stop strings, finish
reasons), what the engine publishes (``step/events.py``), the model runner and its graph runners
(``model_runner.py``, ``runners/``).

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
from pathlib import Path
from typing import Any, Iterable, Optional, Union

from graphtop.models.layers.moe import expert_weight_bytes

from .api.controls import ControlApi
from .api.requests import RequestApi
from .attention.base import AttentionShape
from .attention.select import select_attention_backend
from .config import EngineConfig, context_limit
from .device import resolve_device
from .distributed.group import TensorParallelGroup
from .distributed.setup import RankSetup
from .errors import EngineError, TensorParallelError
from .graphs.config import resolve_graph_config
from .kernel_config import resolve_kernel_config
from .kv_pool import KVLayout, KVPool
from .lifecycle.closing import Closing
from .lifecycle.info import EngineInfo, describe, started_events
from .lifecycle.kernel_cache import kernel_precompile
from .lifecycle.loading import load_engine
from .memory_plan import MiB, check_graph_buffers_fit, graph_reserve_estimate, plan_kv_pool
from .model_runner import ModelRunner
from .parity.checker import ParityChecker
from .parity.scratch import scratch_pages
from .prompts import PromptByteLimit
from .request import FinishReason, Request, RequestHandle, RequestIds
from .scheduler import Scheduler, SchedulerConfig
from .step.background import BackgroundServer
from .step.commands import AwaitCapture, Cancel, Command, CommandQueue, SetParityEvery, Submit
from .step.events import EngineEvents
from .step.guard import StepGuard
from .step.loop import StepLoop
from .step.output import OutputProcessor
from .step.overlap import TokenReadback
from .telemetry import events as ev
from .telemetry.bus import EventBus
from .telemetry.capture import BucketCost

__all__ = ["Engine", "EngineError", "EngineInfo", "TensorParallelError", "resolve_device"]

log = logging.getLogger("graphtop.engine")


def _publishing(engine: "Engine") -> bool:
    """Whether ``engine`` still publishes on its bus (the bus's claim holds until it is closed)."""
    return not engine._closed


class Engine(RequestApi, ControlApi, Closing):
    """An in-process inference engine for one model (see the module docstring); ``from_pretrained``
    builds one from a checkpoint folder."""

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
        self.tp = tp
        self.config = config
        self.bus = bus if bus is not None else EventBus()
        self.bus.check_unclaimed()  # before anything is built or published (claimed once built, below)
        self.checkpoint = checkpoint
        self.model = checkpoint.model
        self.tokenizer = checkpoint.tokenizer
        if config.chat_template is not None:  # before anything reads it (telemetry says whether chat works)
            self.tokenizer.chat_template = config.chat_template
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
        shape = AttentionShape.of(local)
        self.attention, attention_note = select_attention_backend(
            config.attention_backend, self.pool, shape, self.device, self.kernels
        )
        attention_note += self._enable_model_kernels()
        if config.overlap_schedule:
            attention_note += " · overlap schedule"
        self.scheduler = Scheduler(
            self.pool, SchedulerConfig(config.chunked_prefill_size, self.max_running, spec.kv_window)
        )
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
            check_graph_buffers_fit(
                self.model.spec,
                self.dtype,
                self.device,
                max(resolved.decode_bs, default=0),
                max_pages,
                max(resolved.prefill_num_tokens, default=0),
            )
        runner_args = (self.model, self.attention, self.device, resolved, max_pages, self.bus.publish)
        if tp is None:
            setup = f"{local!r}|{self.dtype}|{self.kernels!r}|{attention_note}|{config.page_size}|{max_pages}"
            ahead = kernel_precompile(self.kernels, self.device, config.tp_size, config.cache_dir, setup)
            self.model_runner = ModelRunner(*runner_args, freeze_gc=config.graphs.freeze_gc, precompile=ahead)
        else:
            setup = RankSetup(
                self.attention.name,
                self.kernels,
                config.fused_kernels,
                config.fused_gemv_max_rows,
                resolved,
                max_pages,
                config.graphs.freeze_gc,
            )
            self.model_runner = tp.model_runner(*runner_args, freeze_gc=config.graphs.freeze_gc, setup=setup)
        self.events = EngineEvents(
            self.bus,
            self.device,
            self.scheduler,
            self.pool,
            self.memory_plan,
            self.model_runner,
            self.max_running,
            expert_bytes=expert_weight_bytes(self.model),
        )
        self.parity = ParityChecker(
            self.model,
            self.attention,
            self.pool,
            self.device,
            self.bus.publish,
            scratch_pages=scratch_pages(self.model_runner, self.pool, self.max_running),
            tolerance=config.parity_tolerance,
        )
        self.info = describe(
            checkpoint,
            attention_note,
            self.attention,
            self.model_runner,
            self.pool,
            self.max_running,
            self.max_context_len,
            demo,
            config.tp_size,
        )
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
        self.output = OutputProcessor(
            self.tokenizer,
            frozenset(spec.eos_token_ids),
            self.max_context_len,
            self.pool.capacity_tokens,
            self._release,
            self.bus.publish,
        )
        self.loop = StepLoop(
            self.scheduler,
            self.pool,
            self.model_runner,
            self.output,
            self.events,
            self.commands,
            self._apply,
            TokenReadback(self.device, self.max_running),
            self.max_context_len,
            config.overlap_schedule,
            self.parity,
        )
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
        if not (
            self.config.fused_kernels
            and self.model.enable_fused_kernels(
                self.config.fused_gemv_max_rows,
                gemv=k.gemv_layers,
                pdl=k.pdl,
                skinny=k.skinny_layers,
                packed=k.skinny_packed,
                fused_mlp=k.fused_mlp,
            )
        ):
            return ""
        note = " · model kernels: triton-fused"
        if self.model.fused_gemv_rows:
            note += f" (fused-GEMV layers for steps of <= {self.model.fused_gemv_rows} tokens)"
        if self.model.fused_mlp_layers():
            note += " · fused MLP: one launch a layer"
        elif k.mlp_fused:  # asked for by name: say that it did not take effect
            note += " · fused MLP: not for this model"
        if k.skinny_packed:  # asked for: say where it took effect, and what it holds
            rows = self.model.packed_rows()
            note += (
                f" · packed skinny weights for steps of {', '.join(f'{a}-{b}' for a, b in rows)} tokens"
                f" ({self.model.packed_bytes() / 2**30:.1f} GiB)"
                if rows
                else " · packed skinny weights: none for this shape"
            )
        return note

    def _publish_started(self) -> None:
        for event in started_events(self.info, self.model_runner.resolved):
            self.bus.publish(event)

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
            raise EngineError(
                "the background thread is serving this engine (start_background); "
                "wait on the handles instead of calling step()"
            )
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
            self.bus.publish(
                ev.RequestQueued(
                    request_id=req.request_id,
                    prompt_tokens=len(req.prompt_ids),
                    max_new_tokens=req.params.max_new_tokens,
                )
            )
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
