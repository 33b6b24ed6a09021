"""Prometheus metrics derived from the engine's event stream: one source of truth with the dashboard and
the trace.

``MetricsCollector(bus)`` subscribes to an engine's ``EventBus`` and keeps a ``prometheus_client``
registry of its own up to date from a daemon thread, so the numbers a scrape shows are the numbers
``graphtop trace summary`` computes from a trace of the same run: a graph step counted here is a
``step`` event there. ``graphtop serve`` exposes it at ``/metrics``; a program using the Python API can
expose it too (``prometheus_client.start_http_server(port, registry=collector.registry)``).

Why a subscriber and not hooks in the engine: the engine publishes events without blocking and
without device syncs, and already names everything worth counting (steps by phase, bucket and path,
fallback reasons, capture costs, parity checks, request latencies). Reading them costs the engine
nothing but a deque append per event; counting them again inside the step loop would cost it more.

Ordering: a single thread applies events in the order they were published (per-request state, the
first token before the finish, depends on it). ``refresh()`` waits until that thread has applied
everything queued before the call, so a scrape right after a request finished sees it.

Tensor parallelism: steps are rank 0's; capture costs are counted for rank 0 (every rank captures the
same buckets). Imports no torch (the telemetry contract).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Optional

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from .bus import EventBus
from .events import (
    CaptureFinished,
    CaptureProgress,
    CaptureStarted,
    EngineStarted,
    ErrorEvent,
    Event,
    KVPoolState,
    ParityCheck,
    RecaptureFinished,
    RecaptureRequested,
    RequestFinished,
    RequestFirstToken,
    RequestQueued,
    StepEvent,
)
from .latency import mean_itl_ms

__all__ = ["CONTENT_TYPE", "EngineMetrics", "MetricsCollector", "PREFIX"]

PREFIX = "graphtop:"
CONTENT_TYPE = CONTENT_TYPE_LATEST
UNSPECIFIED = "unspecified"
"""The reason label of an eager step that gave none."""

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
ITL_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
REPLAY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024)

TYPES = frozenset(
    cls.type
    for cls in (
        EngineStarted,
        CaptureStarted,
        CaptureProgress,
        CaptureFinished,
        KVPoolState,
        StepEvent,
        ParityCheck,
        RequestQueued,
        RequestFirstToken,
        RequestFinished,
        RecaptureFinished,
        RecaptureRequested,
        ErrorEvent,
    )
)
"""The event types the metrics read (the subscription carries no others)."""


@dataclass
class EngineMetrics:
    """Every metric, registered in one registry. Names follow vLLM's and SGLang's where one exists
    (``vllm:time_to_first_token_seconds``, ``sglang:cuda_graph_passes_total{mode}``), with our prefix."""

    registry: CollectorRegistry

    def __post_init__(self) -> None:
        r, p = self.registry, PREFIX
        self.info = Gauge(
            p + "engine_info",
            "the engine being served (value 1)",
            ["model", "device", "dtype", "decode_graph_backend", "prefill_graph_backend"],
            registry=r,
        )
        self.running = Gauge(p + "num_requests_running", "requests admitted to the running batch", registry=r)
        self.waiting = Gauge(p + "num_requests_waiting", "requests waiting for a running slot", registry=r)
        self.max_running = Gauge(p + "max_running_requests", "the largest running batch", registry=r)
        self.kv_usage = Gauge(p + "kv_cache_usage_perc", "fraction of the KV pool in use (0-1)", registry=r)
        self.kv_used = Gauge(p + "kv_cache_used_tokens", "KV pool tokens in use", registry=r)
        self.kv_capacity = Gauge(p + "kv_cache_capacity_tokens", "KV pool size in tokens", registry=r)
        self.queued = Counter(p + "requests_queued", "requests the engine accepted", registry=r)
        self.finished = Counter(
            p + "requests_finished",
            "finished requests by reason (eos, stop, length, cancelled, rejected)",
            ["finish_reason"],
            registry=r,
        )
        self.prompt_tokens = Counter(p + "prompt_tokens", "prompt tokens of accepted requests", registry=r)
        self.generation_tokens = Counter(p + "generation_tokens", "tokens generated", registry=r)
        self.ttft = Histogram(
            p + "time_to_first_token_seconds", "time from arrival to the first token", buckets=TTFT_BUCKETS, registry=r
        )
        self.itl = Histogram(
            p + "inter_token_latency_seconds",
            "mean time between output tokens, one sample per finished request of two or more tokens",
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            p + "e2e_request_latency_seconds",
            "time from arrival to the finish of a request that was served (rejected ones excluded)",
            buckets=E2E_BUCKETS,
            registry=r,
        )
        self.passes = Counter(
            p + "cuda_graph_passes",
            "forward steps by phase and mode (graph: replayed a graph; eager)",
            ["phase", "mode"],
            registry=r,
        )
        self.bucket_hits = Counter(
            p + "graph_bucket_hits", "graph steps that replayed this bucket", ["phase", "bucket"], registry=r
        )
        self.bucket_padded = Counter(
            p + "graph_bucket_padded_tokens",
            "padding rows (decode) or tokens (prefill) those graph steps carried",
            ["phase", "bucket"],
            registry=r,
        )
        self.fallbacks = Counter(p + "eager_fallbacks", "eager steps by reason", ["phase", "reason"], registry=r)
        self.replay = Histogram(
            p + "graph_replay_seconds", "replay time of a graph step", ["phase"], buckets=REPLAY_BUCKETS, registry=r
        )
        self.capture_seconds = Gauge(
            p + "graph_capture_seconds",
            "how long this bucket's graph took to capture (its latest capture)",
            ["phase", "bucket"],
            registry=r,
        )
        self.capture_bytes = Gauge(
            p + "graph_capture_bytes",
            "device memory this bucket's graph took (its latest capture)",
            ["phase", "bucket"],
            registry=r,
        )
        self.capture_failures = Counter(
            p + "graph_capture_failures", "buckets whose capture failed", ["phase"], registry=r
        )
        self.graphs = Gauge(p + "graphs_captured", "buckets captured in the latest capture pass", ["phase"], registry=r)
        self.parity_checks = Counter(
            p + "parity_checks", "graph steps re-run eagerly and compared (--parity-every)", ["phase"], registry=r
        )
        self.parity_mismatches = Counter(
            p + "parity_mismatches", "parity checks over their tolerance", ["phase"], registry=r
        )
        self.recaptures = Counter(p + "recaptures", "live recaptures by result (ok, failed)", ["result"], registry=r)
        self.recapture_requests = Counter(
            p + "recapture_requests", "live recaptures asked for, by cause (manual, auto_tune)", ["cause"], registry=r
        )
        self.errors = Counter(p + "errors", "error events by where they happened", ["where"], registry=r)
        self.dropped = Gauge(
            p + "metrics_events_dropped",
            "events the metrics subscriber lost to a full queue (nonzero: the counters undercount)",
            registry=r,
        )


class MetricsCollector:
    """Subscribes to ``bus`` and keeps ``registry`` (its own, or the one given) up to date from a daemon
    thread. Subscribe before the engine publishes what should be counted (the CLI builds the collector
    before loading the model, so capture costs are in). ``close()`` unsubscribes."""

    def __init__(
        self,
        bus: EventBus,
        registry: Optional[CollectorRegistry] = None,
        *,
        maxsize: int = 100_000,
        name: str = "metrics",
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = EngineMetrics(self.registry)
        self._bus = bus
        self._sub = bus.subscribe(name, maxsize, TYPES)
        self.metrics.dropped.set_function(lambda: self._sub.dropped)
        self._cond = threading.Condition()
        self._applied = 0
        self._ttft_ms: dict[str, float] = {}  # requests between their first token and their finish
        self._capture_labels: dict[str, set[str]] = {}  # phase -> buckets with capture gauges
        self._thread = threading.Thread(target=self._run, name="graphtop-metrics", daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        return self._sub.dropped

    def refresh(self, timeout: float = 1.0) -> bool:
        """Wait until every event queued before this call is applied (False if ``timeout`` ran out)."""
        target = self._sub.accepted
        with self._cond:
            return self._cond.wait_for(lambda: self._applied >= target or self._sub.closed, timeout)

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format, every event published before the call counted."""
        self.refresh()
        return generate_latest(self.registry)

    def close(self, timeout: float = 2.0) -> None:
        """Unsubscribe; events still queued are applied first."""
        self._bus.unsubscribe(self._sub)
        self._thread.join(timeout)

    def _run(self) -> None:
        sub = self._sub
        while True:
            event = sub.get(timeout=0.5)
            if event is None:
                if sub.closed and sub.pending == 0:
                    with self._cond:
                        self._cond.notify_all()
                    return
                continue
            batch = [event, *sub.drain(255)]
            with self._cond:
                for e in batch:
                    self.apply(e)
                self._applied += len(batch)
                self._cond.notify_all()

    def apply(self, event: Event) -> None:
        """Count one event (the collector's thread calls it; tests may feed events directly)."""
        m = self.metrics
        if isinstance(event, StepEvent):
            self._step(event)
        elif isinstance(event, KVPoolState):
            m.running.set(event.running)
            m.waiting.set(event.queued)
            m.max_running.set(event.max_running)
            m.kv_used.set(event.used_tokens)
            m.kv_capacity.set(event.capacity_tokens)
            m.kv_usage.set(event.used_tokens / event.capacity_tokens if event.capacity_tokens else 0.0)
        elif isinstance(event, RequestQueued):
            m.queued.inc()
            m.prompt_tokens.inc(event.prompt_tokens)
        elif isinstance(event, RequestFirstToken):
            m.ttft.observe(event.ttft_ms / 1e3)
            self._ttft_ms[event.request_id] = event.ttft_ms
        elif isinstance(event, RequestFinished):
            self._finished(event)
        elif isinstance(event, (CaptureStarted, CaptureProgress, CaptureFinished)):
            self._capture(event)
        elif isinstance(event, ParityCheck):
            m.parity_checks.labels(event.phase).inc()
            if event.mismatch:
                m.parity_mismatches.labels(event.phase).inc()
        elif isinstance(event, RecaptureFinished):
            m.recaptures.labels("ok" if event.ok else "failed").inc()
        elif isinstance(event, RecaptureRequested):
            m.recapture_requests.labels(event.cause or UNSPECIFIED).inc()
        elif isinstance(event, ErrorEvent):
            m.errors.labels(event.where or UNSPECIFIED).inc()
        elif isinstance(event, EngineStarted):
            m.info.clear()
            m.info.labels(
                event.model, event.device, event.dtype, event.decode_graph_backend, event.prefill_graph_backend
            ).set(1)

    def _step(self, ev: StepEvent) -> None:
        m = self.metrics
        m.passes.labels(ev.phase, ev.path).inc()
        if ev.path == "graph":
            if ev.bucket is not None:
                bucket = str(ev.bucket)
                m.bucket_hits.labels(ev.phase, bucket).inc()
                m.bucket_padded.labels(ev.phase, bucket).inc(ev.padded)
            if ev.replay_ms is not None:
                m.replay.labels(ev.phase).observe(ev.replay_ms / 1e3)
        else:
            m.fallbacks.labels(ev.phase, ev.fallback_reason or UNSPECIFIED).inc()

    def _finished(self, ev: RequestFinished) -> None:
        m = self.metrics
        m.finished.labels(ev.finish_reason or UNSPECIFIED).inc()
        m.generation_tokens.inc(ev.output_tokens)
        ttft = self._ttft_ms.pop(ev.request_id, None)
        if ev.finish_reason == "rejected":
            return
        m.e2e.observe(ev.latency_ms / 1e3)
        itl = mean_itl_ms(ttft, ev.latency_ms, ev.output_tokens)
        if itl is not None:
            m.itl.observe(itl / 1e3)

    def _capture(self, ev: Event) -> None:
        if getattr(ev, "rank", 0) != 0:
            return
        m = self.metrics
        if isinstance(ev, CaptureStarted):  # a new pass replaces the phase's graphs: their costs go with them
            for bucket in self._capture_labels.pop(ev.phase, set()):
                m.capture_seconds.remove(ev.phase, bucket)
                m.capture_bytes.remove(ev.phase, bucket)
        elif isinstance(ev, CaptureProgress):
            if not ev.ok:
                m.capture_failures.labels(ev.phase).inc()
                return
            bucket = str(ev.bucket)
            self._capture_labels.setdefault(ev.phase, set()).add(bucket)
            m.capture_seconds.labels(ev.phase, bucket).set(ev.seconds)
            m.capture_bytes.labels(ev.phase, bucket).set(ev.memory_bytes)
        elif isinstance(ev, CaptureFinished):
            m.graphs.labels(ev.phase).set(len(ev.captured))
