"""Routes each batch to a graph runner or the eager runner, and owns graph (re)capture.

Graphs are a fast path, never the only path: a batch a graph cannot take runs eagerly and the step
record carries the named ``FallbackReason``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Optional, Sequence


from .batch import ForwardBatch, ForwardMode
from .graphs.config import (
    GraphConfig,
    GraphConfigError,
    ResolvedGraphConfig,
    check_bucket_count,
    resolve_graph_config,
)
from .graphs.fallback import FallbackReason
from .memory_plan import check_graph_buffers_fit
from .runners.base import StepOutput
from .runners.bucketed import BucketedGraphRunner
from .runners.decode_graph import DecodeGraphRunner
from .runners.eager import EagerRunner
from .runners.prefill_graph import PrefillGraphRunner
from .telemetry import events as ev

if TYPE_CHECKING:  # pragma: no cover
    from .engine import Engine

RECAPTURE_SLICE_S = 0.05  # capture time per step boundary while a recapture is running


class ModelRunner:
    def __init__(self, engine: "Engine", graph_config: GraphConfig):
        self.engine = engine
        device = engine.device
        self.resolved: ResolvedGraphConfig = resolve_graph_config(
            graph_config,
            max_running=engine.max_running,
            pool_tokens=engine.pool.capacity_tokens,
            chunked_prefill_size=engine.config.chunked_prefill_size,
            cuda_graphs_available=device.type == "cuda",
            attention_supports_decode_graph=engine.attention.supports_decode_graph,
        )
        self.emulated = self.resolved.emulated
        self.eager = EagerRunner(engine.model, engine.attention, device)
        self.decode: Optional[DecodeGraphRunner] = None
        self.prefill: Optional[PrefillGraphRunner] = None
        r = self.resolved
        max_pages = engine.pool.pages_for(engine.max_context_len)
        if r.available:
            check_graph_buffers_fit(engine.spec, engine.dtype, device, max(r.decode_bs, default=0), max_pages,
                                    max(r.prefill_num_tokens, default=0))
        if r.available and r.decode_backend != "disabled" and r.decode_bs:
            self.decode = DecodeGraphRunner(
                engine.model, engine.attention, device, max(r.decode_bs), max_pages, self.emulated, engine._publish
            )
        if r.available and r.prefill_backend != "disabled" and r.prefill_num_tokens:
            self.prefill = PrefillGraphRunner(
                engine.model, engine.attention, device, max(r.prefill_num_tokens),
                r.prefill_max_padding_waste, self.emulated, engine._publish,
            )

    def _label(self, runner: Optional[BucketedGraphRunner], kind: str) -> str:
        if runner is None:
            return "disabled" if self.resolved.available else "off (no CUDA graphs)"
        return f"emulated-{kind}" if self.emulated else kind

    @property
    def decode_backend_label(self) -> str:
        return self._label(self.decode, "full")

    @property
    def prefill_backend_label(self) -> str:
        return self._label(self.prefill, "breakable")

    @property
    def decode_buckets(self) -> list[int]:
        return list(self.decode.buckets) if self.decode else []

    @property
    def prefill_buckets(self) -> list[int]:
        return list(self.prefill.buckets) if self.prefill else []

    def graph_memory(self) -> tuple[int, int]:
        return (
            self.decode.memory_bytes() if self.decode else 0,
            self.prefill.memory_bytes() if self.prefill else 0,
        )

    def capture_ledger(self) -> list:
        out = []
        for runner in (self.decode, self.prefill):
            if runner is not None:
                out.extend(sorted(runner.ledger.values(), key=lambda c: c.bucket))
        return out

    # --- capture -------------------------------------------------------------------------------
    def capture_initial(self) -> None:
        if self.decode is not None:
            self.decode.start_capture(self.resolved.decode_bs, "initial")
            self.decode.advance_capture(None)
        if self.prefill is not None:
            self.prefill.start_capture(self.resolved.prefill_num_tokens, "initial")
            self.prefill.advance_capture(None)

    def validate_buckets(self, phase: str, sizes: Sequence[int]) -> list[int]:
        runner = self.decode if phase == "decode" else self.prefill
        if runner is None:
            raise GraphConfigError(f"{phase} graphs are disabled; nothing to recapture")
        if not sizes:
            raise GraphConfigError(f"{phase} bucket list is empty")
        check_bucket_count(f"{phase} buckets", list(sizes))
        out = []
        for s in sizes:
            if isinstance(s, bool) or not isinstance(s, int):
                raise GraphConfigError(f"{phase} bucket {s!r} is not an integer")
            if s <= 0:
                raise GraphConfigError(f"{phase} bucket {s} must be positive")
            if s > runner.max_size:
                raise GraphConfigError(f"{phase} bucket {s} is over the static buffers' maximum {runner.max_size}")
            out.append(s)
        return sorted(set(out))

    def recapture(self, decode_bs: Optional[Sequence[int]], prefill_tokens: Optional[Sequence[int]]) -> None:
        """Validate, release the old graphs, and start capturing; the rest happens between steps."""
        try:
            lists = {}
            if decode_bs is not None:
                lists["decode"] = self.validate_buckets("decode", decode_bs)
            if prefill_tokens is not None:
                lists["prefill"] = self.validate_buckets("prefill", prefill_tokens)
            if not lists:
                raise GraphConfigError("recapture needs a decode or a prefill bucket list")
        except GraphConfigError as e:
            self.engine._publish(
                ev.RecaptureFinished(ok=False, decode_bs=tuple(self.decode_buckets),
                                     prefill_num_tokens=tuple(self.prefill_buckets), message=str(e))
            )
            return
        before = sum(self.graph_memory())
        self._recapture_memory_before = before
        self._recapture_started = time.perf_counter()
        for phase, sizes in lists.items():
            runner = self.decode if phase == "decode" else self.prefill
            assert runner is not None
            runner.start_capture(sizes, "recapture")
        self._pending_recapture = True
        self.advance_recapture()

    _pending_recapture = False

    @property
    def recapture_pending(self) -> bool:
        return self._pending_recapture

    def advance_recapture(self) -> None:
        if not self._pending_recapture:
            return
        done = True
        for runner in (self.decode, self.prefill):
            if runner is not None and runner.recapturing:
                done = runner.advance_capture(RECAPTURE_SLICE_S) and done
        if not done:
            return
        self._pending_recapture = False
        after = sum(self.graph_memory())
        failed = [b for r in (self.decode, self.prefill) if r for b in r.configured if b not in r.buckets]
        msg = "recaptured" if not failed else f"captured with failures: buckets {failed} run eagerly"
        self.engine._publish(
            ev.RecaptureFinished(
                ok=not failed, decode_bs=tuple(self.decode_buckets), prefill_num_tokens=tuple(self.prefill_buckets),
                seconds=round(time.perf_counter() - self._recapture_started, 6),
                memory_freed_bytes=int(self._recapture_memory_before), memory_bytes=int(after), message=msg,
            )
        )
        self.engine.publish_memory_ledger()

    # --- forward -------------------------------------------------------------------------------
    def forward(self, batch: ForwardBatch) -> StepOutput:
        self.advance_recapture()
        runner = self.decode if batch.mode is ForwardMode.DECODE else self.prefill
        if runner is None:
            r = self.resolved
            backend = r.decode_backend if batch.mode is ForwardMode.DECODE else r.prefill_backend
            # enabled, but no bucket survived the limits: say so rather than "disabled"
            if backend == "disabled":
                reason = FallbackReason.PHASE_DISABLED
            elif not r.available:
                reason = FallbackReason.NO_CUDA_GRAPHS
            else:
                reason = FallbackReason.NO_GRAPHS_CAPTURED
        else:
            reason = runner.can_run(batch)
        if reason is None:
            assert runner is not None
            return runner.run(batch)
        out = self.eager.run(batch)
        out.fallback_reason = reason
        return out
