"""The engine: one object that owns the model, the KV pool, the scheduler and the runners.

Threading: ``step()`` is the whole hot loop and runs on one thread (the caller's, or the engine's own
after ``start_background()``). Other threads talk to it only through a command queue drained between
steps (submit, cancel, recapture) and read results through thread-safe ``RequestHandle``s and the
event bus. The engine publishes events without blocking and without extra device syncs.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence, Union

import torch

from .telemetry import events as ev
from .attention.base import AttentionShape
from .attention.select import select_attention_backend
from .batch import ForwardBatch, ForwardMode
from .config import EngineConfig
from .detokenizer import IncrementalDetokenizer
from .telemetry.bus import EventBus
from .kv_pool import KVLayout, KVPool
from .memory_plan import MiB, plan_kv_pool
from .model_runner import ModelRunner
from .overlap import PLACEHOLDER_TOKEN, InFlightStep, TokenReadback, can_chain, launchable
from .request import FinishReason, Request, RequestHandle, RequestStatus
from .sampler import sample
from .sampling_params import SamplingParams
from .scheduler import Scheduler, SchedulerConfig

log = logging.getLogger("graphtop.engine")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class EngineError(RuntimeError):
    """A problem the user can fix (bad device, backend unavailable, …); the message is one line."""


@dataclass(frozen=True)
class EngineInfo:
    model: str
    architecture: str
    device: str
    device_name: str
    dtype: str
    attention_backend: str
    attention_backend_note: str
    decode_graph_backend: str
    prefill_graph_backend: str
    emulated: bool
    kv_capacity_tokens: int
    max_running: int
    max_context_len: int
    page_size: int
    demo: bool


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise EngineError(f"unknown device {name!r}; use cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise EngineError("device cuda was asked for, but torch sees no CUDA device here")
    if dev.type not in ("cpu", "cuda"):
        raise EngineError(f"unsupported device {name!r}; use cpu, cuda or cuda:N")
    return dev


def _device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return "CPU"


class Engine:
    def __init__(
        self,
        checkpoint: Any,
        config: EngineConfig,
        bus: Optional[EventBus] = None,
        *,
        demo: bool = False,
        progress: Optional[Callable[[ev.Event], None]] = None,
    ):
        self.config = config
        self.bus = bus if bus is not None else EventBus()
        self.checkpoint = checkpoint
        self.model = checkpoint.model
        self.tokenizer = checkpoint.tokenizer
        self.spec = checkpoint.spec
        self.device = next(self.model.parameters()).device
        self.dtype = next(self.model.parameters()).dtype
        self.demo = demo
        spec = self.spec

        self._eos_ids = frozenset(spec.eos_token_ids)
        self.max_context_len = min(config.max_context_len or spec.max_position_embeddings, spec.max_position_embeddings)
        layout = KVLayout(spec.num_layers, spec.num_kv_heads, spec.head_dim, self.dtype)
        self.memory_plan = plan_kv_pool(
            device=self.device,
            weights_bytes=checkpoint.weights_bytes,
            bytes_per_token=layout.bytes_per_token,
            page_size=config.page_size,
            mem_fraction_static=config.mem_fraction_static,
            cpu_kv_budget_bytes=config.cpu_kv_budget_mb * MiB,
            activation_reserve_bytes=config.activation_reserve_mb * MiB,
            graph_reserve_bytes=_graph_reserve_estimate(self.device),
            max_total_tokens=config.max_total_tokens,
        )
        self.pool = KVPool(layout, self.memory_plan.num_pages, config.page_size, self.device)
        self.max_running = min(config.max_running_requests or 256, self.pool.capacity_pages)
        shape = AttentionShape(spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.head_dim**-0.5)
        self.attention, attention_note = select_attention_backend(
            config.attention_backend, self.pool, shape, self.device
        )
        if config.fused_kernels and self.model.enable_fused_kernels(config.fused_gemv_max_rows):
            attention_note += " · model kernels: triton-fused"
            if self.model.fused_gemv_rows:
                attention_note += f" (fused-GEMV layers for steps of <= {self.model.fused_gemv_rows} tokens)"
        if config.overlap_schedule:
            attention_note += " · overlap schedule"
        self.scheduler = Scheduler(self.pool, SchedulerConfig(config.chunked_prefill_size, self.max_running))
        self.model_runner = ModelRunner(self, config.graphs)
        self.info = EngineInfo(
            model=str(checkpoint.path),
            architecture=spec.architecture,
            device=str(self.device),
            device_name=_device_name(self.device),
            dtype=str(self.dtype).replace("torch.", ""),
            attention_backend=self.attention.describe(),
            attention_backend_note=attention_note,
            decode_graph_backend=self.model_runner.decode_backend_label,
            prefill_graph_backend=self.model_runner.prefill_backend_label,
            emulated=self.model_runner.emulated,
            kv_capacity_tokens=self.pool.capacity_tokens,
            max_running=self.max_running,
            max_context_len=self.max_context_len,
            page_size=self.pool.page_size,
            demo=demo,
        )
        self._publish(
            ev.EngineStarted(
                model=self.info.model,
                architecture=self.info.architecture,
                device=self.info.device,
                device_name=self.info.device_name,
                dtype=self.info.dtype,
                attention_backend=self.info.attention_backend,
                attention_backend_note=attention_note,
                decode_graph_backend=self.info.decode_graph_backend,
                prefill_graph_backend=self.info.prefill_graph_backend,
                emulated=self.info.emulated,
                graph_config=self.model_runner.resolved.as_dict(),
                locked_keys=tuple(sorted(self.model_runner.resolved.locked)),
                demo=demo,
            )
        )
        for d in self.model_runner.resolved.downgrades:
            self._publish(ev.ConfigDowngrade(key=d.key, old=d.old, new=d.new, reason=d.reason))
        self._kv_key: tuple[int, int] = (-1, -1)
        self._kv_time = 0.0
        self.model_runner.capture_initial()
        self.publish_memory_ledger()
        self._publish_kv(force=True)

        self._commands: "queue.SimpleQueue[tuple[str, Any]]" = queue.SimpleQueue()
        self._ids = itertools.count()
        self._by_id: dict[str, Request] = {}
        self._step_no = 0
        self.overlap_schedule = config.overlap_schedule  # may be switched between steps
        self._pending: Optional[InFlightStep] = None  # overlap schedule: a decode step not read back yet
        self.overlapped_steps = 0  # steps launched before the previous step was read back
        self._readback = TokenReadback(self.device, self.max_running)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.last_error: Optional[str] = None

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
        from graphtop.models import DEMO_NOTE, ensure_demo_model, load_checkpoint

        config = config or EngineConfig()
        for k, v in overrides.items():
            if not hasattr(config, k):
                raise TypeError(f"unknown engine option {k!r}")
            setattr(config, k, v)
        config.validate()
        device = resolve_device(config.device)
        dtype = DTYPES[config.dtype] if config.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
        demo = path is None
        if demo:
            path = ensure_demo_model()
            log.warning(DEMO_NOTE)
        ckpt = load_checkpoint(path, device=str(device), dtype=dtype,
                               allow_external_weights=config.allow_external_weights)
        return cls(ckpt, config, bus, demo=demo)

    # --- public API ----------------------------------------------------------------------------
    def submit(
        self,
        prompt: Union[str, Sequence[int]],
        params: Optional[SamplingParams] = None,
        *,
        chat: bool = False,
        request_id: Optional[str] = None,
    ) -> RequestHandle:
        """Queue a prompt (text, or token ids). Thread-safe; returns at once with a streaming handle."""
        params = params or SamplingParams()
        rid = request_id or f"req-{next(self._ids)}"
        if isinstance(prompt, str):
            text = prompt
            if chat and getattr(self.tokenizer, "chat_template", None):
                ids = self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
                )
                if isinstance(ids, dict) or hasattr(ids, "keys"):
                    ids = ids["input_ids"]
                ids = list(ids)
            else:
                ids = self.tokenizer.encode(prompt, add_special_tokens=True)
        else:
            ids = [int(t) for t in prompt]
            text = self.tokenizer.decode(ids)
        handle = RequestHandle(rid, self, text, ids)
        problem = self._admission_problem(ids)
        if problem:
            handle._finish(FinishReason.REJECTED, problem)
            self._publish(ev.RequestFinished(request_id=rid, output_tokens=0, finish_reason="rejected", error=problem))
            return handle
        req = Request(rid, list(ids), params, handle)
        if params.detokenize:
            req.detok = IncrementalDetokenizer(self.tokenizer)
        self._commands.put(("submit", req))
        self._wake.set()
        return handle

    def _admission_problem(self, ids: Sequence[int]) -> Optional[str]:
        n = len(ids)
        if n == 0:
            return "empty prompt"
        if n >= self.max_context_len:
            return f"prompt has {n} tokens; the context limit is {self.max_context_len}"
        if n + 1 > self.pool.capacity_tokens:
            return f"prompt has {n} tokens; the KV pool holds only {self.pool.capacity_tokens}"
        vocab = self.spec.vocab_size
        if any(t < 0 or t >= vocab for t in ids):
            return f"prompt has token ids outside the vocabulary (size {vocab})"
        return None

    def generate(
        self, prompts: Iterable[Union[str, Sequence[int]]], params: Optional[SamplingParams] = None
    ) -> list[RequestHandle]:
        """Submit all prompts at once (one continuous batch) and serve them to completion."""
        handles = [self.submit(p, params) for p in prompts]
        if self.background_running:
            for h in handles:
                h.wait()
        else:
            self.run_until_idle()
        return handles

    def cancel(self, request_id: str) -> None:
        self._commands.put(("cancel", request_id))
        self._wake.set()

    def recapture(
        self, decode_bs: Optional[Sequence[int]] = None, prefill_num_tokens: Optional[Sequence[int]] = None
    ) -> None:
        """Replace the captured graphs at the next step boundary; in-flight requests continue."""
        self._publish(
            ev.RecaptureRequested(
                decode_bs=tuple(decode_bs) if decode_bs is not None else None,
                prefill_num_tokens=tuple(prefill_num_tokens) if prefill_num_tokens is not None else None,
            )
        )
        self._commands.put(("recapture", (decode_bs, prefill_num_tokens)))
        self._wake.set()

    @property
    def decode_buckets(self) -> list[int]:
        return self.model_runner.decode_buckets

    @property
    def prefill_buckets(self) -> list[int]:
        return self.model_runner.prefill_buckets

    @property
    def kv_capacity_tokens(self) -> int:
        return self.pool.capacity_tokens

    def capture_ledger(self) -> list:
        return self.model_runner.capture_ledger()

    # --- the loop ------------------------------------------------------------------------------
    def run_until_idle(self) -> None:
        while self.step():
            pass

    def step(self) -> bool:
        """Run one scheduled forward. Returns False when there was nothing to do.

        With the overlap schedule (engine/overlap.py) a greedy decode step is launched here and
        read back in the next call, after that call has launched its own step.
        """
        pending, self._pending = self._pending, None
        worked = pending is not None
        if pending is not None and not self._commands.empty():
            # Commands (submit, cancel, recapture) act on an engine with nothing in flight.
            self._complete(pending, placeholders=False)
            pending = None
        self._drain_commands()
        if pending is not None:
            if can_chain(self, pending):
                for req in pending.batch.requests:  # the token in flight counts for the next step
                    req.output_ids.append(PLACEHOLDER_TOKEN)
                batch = self.scheduler.schedule()
                assert batch is not None and batch.requests == pending.batch.requests
                batch.input_ids_device = pending.tokens_device
                self.overlapped_steps += 1
                t0 = time.perf_counter()
                self._pending = self._readback.launch(batch, self.model_runner.forward(batch), t0)
                self._complete(pending, placeholders=True)
                return True
            self._complete(pending, placeholders=False)
        batch = self.scheduler.schedule()
        if batch is None:
            if self.model_runner.recapture_pending:  # idle: finish the recapture between polls
                self.model_runner.advance_recapture()
                return True
            return worked
        t0 = time.perf_counter()
        out = self.model_runner.forward(batch)
        if self.overlap_schedule and launchable(batch):
            self._pending = self._readback.launch(batch, out, t0)
            return True
        tokens = sample(out.logits, batch.sample_requests)  # .tolist(): the step's one sync
        host_ms = (time.perf_counter() - t0) * 1e3
        self._step_no += 1
        self._publish_step(batch, out, host_ms)
        self._process_tokens(batch, tokens)
        self._publish_kv()
        return True

    def _complete(self, step: InFlightStep, placeholders: bool) -> None:
        """Read a launched step's tokens back and deliver them."""
        tokens = step.tokens()
        self._step_no += 1
        self._publish_step(step.batch, step.out, step.host_ms)
        self._process_tokens(step.batch, tokens, placeholders)
        self._publish_kv()

    def _publish_step(self, batch: ForwardBatch, out: Any, host_ms: float) -> None:
        if not self.bus.has_subscribers:
            return
        real = batch.batch_size if batch.mode is ForwardMode.DECODE else batch.num_tokens
        replay_ms, segment_ms, break_ms = out.read_timing()
        self._publish(
            ev.StepEvent.fast(
                step=self._step_no,
                phase=batch.mode.value,
                batch_size=batch.batch_size,
                num_tokens=batch.num_tokens,
                bucket=out.bucket,
                padded=out.padded,
                padding_waste=(out.padded / (real + out.padded)) if out.padded else 0.0,
                path=out.path,
                fallback_reason=out.fallback_reason.value if out.fallback_reason else None,
                host_ms=round(host_ms, 4),
                replay_ms=_round(replay_ms),
                segment_ms=_round(segment_ms),
                break_ms=_round(break_ms),
                emulated=self.model_runner.emulated and out.path == "graph",
            )
        )

    def _process_tokens(self, batch: ForwardBatch, tokens: list[int], placeholders: bool = False) -> None:
        """``placeholders``: each request's output_ids already ends with a stand-in for its token."""
        now = time.perf_counter()
        eos = self._eos_ids
        for req, tok in zip(batch.sample_requests, tokens):
            if req.status is RequestStatus.FINISHED:
                continue
            if placeholders:
                req.output_ids[-1] = tok
            else:
                req.output_ids.append(tok)
            if req.first_token_time is None:
                req.first_token_time = now
                self._publish(ev.RequestFirstToken(request_id=req.request_id, ttft_ms=(now - req.arrival) * 1e3))
            text = ""
            if req.detok is not None:
                req.detok.push(tok)
                text = req.detok.text
            reason = self._finish_reason(req, tok, eos, text)
            if reason is FinishReason.STOP:
                text = _cut_at_stop(text, req.params.stop)
            elif req.params.stop:
                # Hold back a tail that may be the start of a stop string: streamed text must stay a
                # prefix of the final text, which the stop string (once complete) cuts off.
                text = text[: len(text) - _stop_prefix_len(text, req.params.stop)]
            req.handle._push(tok, text)
            if reason is not None:
                self._finish(req, reason)

    def _finish_reason(self, req: Request, tok: int, eos: frozenset[int], text: str) -> Optional[FinishReason]:
        p = req.params
        if not p.ignore_eos and tok in eos:
            return FinishReason.EOS
        if p.stop and any(s in text for s in p.stop):
            return FinishReason.STOP
        if len(req.output_ids) >= p.max_new_tokens:
            return FinishReason.LENGTH
        if len(req.prompt_ids) + len(req.output_ids) >= self.max_context_len:
            return FinishReason.LENGTH
        if len(req.prompt_ids) + len(req.output_ids) >= self.pool.capacity_tokens:
            # The request alone would outgrow the whole KV pool: preempting it cannot help.
            return FinishReason.LENGTH
        return None

    def _finish(self, req: Request, reason: FinishReason, error: Optional[str] = None) -> None:
        self.scheduler.finish(req)
        self._by_id.pop(req.request_id, None)
        if req.detok is not None and reason is not FinishReason.STOP:
            # The streamed text is provisional; the final text is one full decode of the output.
            text = self.tokenizer.decode(req.output_ids, skip_special_tokens=True)
            req.handle._set_text(text)
        req.handle._finish(reason, error)
        self._publish(
            ev.RequestFinished(
                request_id=req.request_id,
                output_tokens=len(req.output_ids),
                finish_reason=reason.value,
                latency_ms=(time.perf_counter() - req.arrival) * 1e3,
                error=error,
            )
        )

    def _drain_commands(self) -> None:
        while True:
            try:
                kind, arg = self._commands.get_nowait()
            except queue.Empty:
                return
            if kind == "submit":
                req: Request = arg
                self._by_id[req.request_id] = req
                self.scheduler.add(req)
                self._publish(
                    ev.RequestQueued(
                        request_id=req.request_id,
                        prompt_tokens=len(req.prompt_ids),
                        max_new_tokens=req.params.max_new_tokens,
                    )
                )
            elif kind == "cancel":
                req = self._by_id.get(arg)
                if req is not None:
                    self._finish(req, FinishReason.CANCELLED)
            elif kind == "recapture":
                decode_bs, prefill_tokens = arg
                self.model_runner.recapture(decode_bs, prefill_tokens)
                self.publish_memory_ledger()

    # --- background thread ---------------------------------------------------------------------
    @property
    def background_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start_background(self) -> None:
        if self.background_running:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._serve, name="graphtop-engine", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                worked = self.step()
            except Exception as e:  # keep serving what can be served; say what broke
                log.exception("engine step failed")
                self.last_error = f"{type(e).__name__}: {e}"
                self._publish(ev.ErrorEvent(message=self.last_error, where="step", fatal=False))
                self._fail_running(self.last_error)
                continue
            if not worked:
                self._wake.wait(0.05)
                self._wake.clear()

    def _fail_running(self, message: str) -> None:
        self._pending = None  # a launched step's tokens are not delivered to failed requests
        for req in list(self.scheduler.running) + list(self.scheduler.waiting):
            self._finish(req, FinishReason.CANCELLED, error=message)

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def close(self) -> None:
        """Stop serving and give device memory back (graphs, KV pool) without waiting for the GC."""
        self.shutdown()
        self._fail_running("engine closed")
        if self.device.type == "cuda":  # a launched step may still be using graphs and pool
            torch.cuda.synchronize(self.device)
        for runner in (self.model_runner.decode, self.model_runner.prefill):
            if runner is not None:
                runner.release()
        self.model_runner.decode = self.model_runner.prefill = None
        release = getattr(self.attention, "release", None)
        if release is not None:
            release()
        self.pool.release()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()

    # --- events --------------------------------------------------------------------------------
    def _publish(self, event: ev.Event) -> None:
        self.bus.publish(event)

    KV_EVENT_INTERVAL_S = 0.05

    def _publish_kv(self, force: bool = False) -> None:
        """KV state at most every 50 ms, or at once when the running/queued counts change."""
        if not self.bus.has_subscribers:
            return
        s = self.scheduler
        now = time.perf_counter()
        key = (len(s.running), len(s.waiting))
        if not force and key == self._kv_key and now - self._kv_time < self.KV_EVENT_INTERVAL_S:
            return
        self._kv_key, self._kv_time = key, now
        self._publish(
            ev.KVPoolState.fast(
                capacity_tokens=self.pool.capacity_tokens,
                used_tokens=s.used_tokens,
                page_size=self.pool.page_size,
                running=len(s.running),
                queued=len(s.waiting),
                max_running=self.max_running,
            )
        )

    def publish_memory_ledger(self) -> None:
        plan = self.memory_plan
        decode_b, prefill_b = self.model_runner.graph_memory()
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
        else:
            total = plan.weights_bytes + self.pool.nbytes
            free = 0
        self._publish(
            ev.MemoryLedger(
                device=str(self.device),
                total=int(total),
                weights=int(plan.weights_bytes),
                kv_pool=int(self.pool.nbytes),
                decode_graphs=int(decode_b),
                prefill_graphs=int(prefill_b),
                activation_reserve=int(plan.activation_reserve_bytes),
                free=int(free),
            )
        )


def _round(v: Optional[float]) -> Optional[float]:
    return None if v is None else round(v, 4)


def _cut_at_stop(text: str, stops: Sequence[str]) -> str:
    cut = min((text.find(s) for s in stops if s in text), default=-1)
    return text[:cut] if cut >= 0 else text


def _stop_prefix_len(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of one of ``stops``."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


def _graph_reserve_estimate(device: torch.device) -> int:
    """Room kept for graph pools before they are measured (replaced by measurements after capture)."""
    return 1024 * MiB if device.type == "cuda" else 0
