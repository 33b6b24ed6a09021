"""Prometheus metrics derived from the engine's event stream: one source of truth with the dashboard and
the trace.

``MetricsCollector(bus)`` subscribes to an engine's ``EventBus`` and keeps a ``prometheus_client``
registry of its own up to date from a daemon thread, so the numbers a scrape shows are the numbers
``graphtop trace summary`` computes from a trace of the same run: a graph step counted here is a
``step`` event there. ``graphtop serve`` exposes it at ``/metrics``; a program using the Python API can
expose it too (``prometheus_client.start_http_server(port, registry=collector.registry)``).

The counts are a view over a ``RunFold`` (``fold``, the fold the dashboard and the trace summary read
too): at each scrape the counters and gauges are read off it, so a graph step counted here is one
counted there by the same code. The latency and replay histograms hear each sample as the fold
derives it (a histogram's buckets need every sample, which the fold does not keep).

Why a subscriber and not hooks in the engine: the engine publishes events without blocking and
without device syncs, and already names everything worth counting (steps by phase, bucket and path,
fallback reasons, capture costs, parity checks, request latencies). Reading them costs the engine
nothing but a deque append per event; counting them again inside the step loop would cost it more.

Ordering: a single thread applies events in the order they were published (per-request state, the
first token before the finish, depends on it). ``refresh()`` waits until that thread has applied
everything queued before the call, so a scrape right after a request finished sees it.

Tensor parallelism: steps are rank 0's; capture costs are counted for rank 0 (every rank captures the
same buckets). Imports no torch (the telemetry contract).

Names follow vLLM's and SGLang's where one exists (``vllm:time_to_first_token_seconds``,
``sglang:cuda_graph_passes_total{mode}``), with our prefix.
"""

from __future__ import annotations

import threading
from typing import Iterator, Optional

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

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
from .fold import FoldLimits, RunFold
from .fold_requests import Finished

__all__ = ["CONTENT_TYPE", "LatencyHistograms", "MetricsCollector", "PREFIX"]

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


class LatencyHistograms:
    """The histograms, registered in ``registry``: each observes the samples the fold hands it."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r, p = registry, PREFIX
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
        self.replay = Histogram(
            p + "graph_replay_seconds", "replay time of a graph step", ["phase"], buckets=REPLAY_BUCKETS, registry=r
        )

    def listen(self, fold: RunFold) -> None:
        fold.requests.ttft_ms.listeners.append(lambda ms: self.ttft.observe(ms / 1e3))
        fold.requests.on_finish.append(self.finished)
        fold.steps.replay_by_phase.listen(lambda phase, ms: self.replay.labels(phase).observe(ms / 1e3))

    def finished(self, done: Finished) -> None:
        if not done.served:
            return
        self.e2e.observe(done.latency_ms / 1e3)
        if done.itl_ms is not None:
            self.itl.observe(done.itl_ms / 1e3)


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
        self.fold = RunFold(FoldLimits(steps=0, samples=0, alerts=0, captures=1))
        self.histograms = LatencyHistograms(self.registry)
        self.histograms.listen(self.fold)
        self._bus = bus
        self._sub = bus.subscribe(name, maxsize, TYPES)
        self._cond = threading.Condition()  # its lock: the fold is applied, or read, by one thread at a time
        self._applied = 0
        self.registry.register(_FoldCounts(self))
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
                    self.fold.apply(e)
                self._applied += len(batch)
                self._cond.notify_all()

    def apply(self, event: Event) -> None:
        """Fold one event (the collector's thread calls it; tests may feed events directly)."""
        with self._cond:
            self.fold.apply(event)


class _FoldCounts(Collector):
    """The counters and gauges, read off the collector's fold at each scrape (under its lock)."""

    def __init__(self, owner: MetricsCollector) -> None:
        self._owner = owner

    def collect(self) -> Iterator[Metric]:
        with self._owner._cond:
            yield from _engine(self._owner.fold, self._owner.dropped)
            yield from _steps(self._owner.fold)
            yield from _captures(self._owner.fold)


def _counter(name: str, doc: str, labels: tuple[str, ...], values: dict[tuple[str, ...], float]) -> Metric:
    family = CounterMetricFamily(PREFIX + name, doc, labels=labels)
    for key, value in sorted(values.items()):
        family.add_metric(key, value)
    return family


def _gauge(name: str, doc: str, labels: tuple[str, ...], values: dict[tuple[str, ...], float]) -> Metric:
    family = GaugeMetricFamily(PREFIX + name, doc, labels=labels)
    for key, value in sorted(values.items()):
        family.add_metric(key, value)
    return family


def _engine(fold: RunFold, dropped: int) -> Iterator[Metric]:
    info, kv, req = fold.info, fold.kv, fold.requests
    labels = ("model", "device", "dtype", "decode_graph_backend", "prefill_graph_backend")
    yield _gauge(
        "engine_info",
        "the engine being served (value 1)",
        labels,
        {tuple(str(getattr(info, name)) for name in labels): 1.0} if info is not None else {},
    )
    for name, doc, value in (
        ("num_requests_running", "requests admitted to the running batch", kv.running if kv else 0),
        ("num_requests_waiting", "requests waiting for a running slot", kv.queued if kv else 0),
        ("max_running_requests", "the largest running batch", kv.max_running if kv else 0),
        ("kv_cache_usage_perc", "fraction of the KV pool in use (0-1)", fold.kv_usage),
        ("kv_cache_used_tokens", "KV pool tokens in use", kv.used_tokens if kv else 0),
        ("kv_cache_capacity_tokens", "KV pool size in tokens", kv.capacity_tokens if kv else 0),
        ("metrics_events_dropped", _DROPPED, dropped),
    ):
        yield _gauge(name, doc, (), {(): float(value)})
    yield _counter("requests_queued", "requests the engine accepted", (), {(): req.queued})
    yield _counter(
        "requests_finished",
        "finished requests by reason (eos, stop, length, cancelled, rejected)",
        ("finish_reason",),
        {(reason,): n for reason, n in req.reasons_or(UNSPECIFIED).items()},
    )
    yield _counter("prompt_tokens", "prompt tokens of accepted requests", (), {(): req.prompt_tokens})
    yield _counter("generation_tokens", "tokens generated", (), {(): req.output_tokens})
    yield _counter(
        "parity_checks", "graph steps re-run eagerly and compared (--parity-every)", ("phase",), _by(fold.parity_checks)
    )
    yield _counter("parity_mismatches", "parity checks over their tolerance", ("phase",), _by(fold.parity_mismatches))
    causes = {(cause or UNSPECIFIED,): n for cause, n in fold.recapture_causes.items()}
    yield _counter("recaptures", "live recaptures by result (ok, failed)", ("result",), _by(fold.recapture_results))
    yield _counter("recapture_requests", "live recaptures asked for, by cause (manual, auto_tune)", ("cause",), causes)
    errors = {(where or UNSPECIFIED,): n for where, n in fold.errors_by_where.items()}
    yield _counter("errors", "error events by where they happened", ("where",), errors)


def _steps(fold: RunFold) -> Iterator[Metric]:
    passes: dict[tuple[str, ...], float] = {}
    hits: dict[tuple[str, ...], float] = {}
    padded: dict[tuple[str, ...], float] = {}
    for phase, tally in fold.steps.phases.items():
        for mode, n in (("graph", tally.graph_steps), ("eager", tally.eager_steps)):
            if n:
                passes[(phase, mode)] = n
        for bucket, b in tally.buckets.items():
            hits[(phase, str(bucket))] = b.count
            padded[(phase, str(bucket))] = b.padded_tokens
    yield _counter(
        "cuda_graph_passes",
        "forward steps by phase and mode (graph: replayed a graph; eager)",
        ("phase", "mode"),
        passes,
    )
    yield _counter("graph_bucket_hits", "graph steps that replayed this bucket", ("phase", "bucket"), hits)
    yield _counter(
        "graph_bucket_padded_tokens",
        "padding rows (decode) or tokens (prefill) those graph steps carried",
        ("phase", "bucket"),
        padded,
    )
    fallbacks = {(phase, reason or UNSPECIFIED): n for (phase, reason), n in fold.steps.fallbacks.items()}
    yield _counter("eager_fallbacks", "eager steps by reason", ("phase", "reason"), fallbacks)


def _captures(fold: RunFold) -> Iterator[Metric]:
    """Capture costs of each phase's latest pass on rank 0: a new pass replaces the phase's graphs, and
    their costs go with them."""
    seconds: dict[tuple[str, ...], float] = {}
    memory: dict[tuple[str, ...], float] = {}
    for phase, cap in fold.captures.latest.items():
        for cost in cap.costs:
            if cost.ok:
                seconds[(phase, str(cost.bucket))] = cost.seconds
                memory[(phase, str(cost.bucket))] = cost.memory_bytes
    yield _gauge(
        "graph_capture_seconds", "how long this bucket's graph took to capture (its latest capture)", _BUCKET, seconds
    )
    yield _gauge("graph_capture_bytes", "device memory this bucket's graph took (its latest capture)", _BUCKET, memory)
    yield _counter("graph_capture_failures", "buckets whose capture failed", ("phase",), _by(fold.capture_failures))
    yield _gauge(
        "graphs_captured", "buckets captured in the latest capture pass", ("phase",), _by(fold.graphs_captured)
    )


def _by(counts: "dict[str, int]") -> dict[tuple[str, ...], float]:
    return {(key,): float(n) for key, n in counts.items()}


_BUCKET = ("phase", "bucket")
_DROPPED = "events the metrics subscriber lost to a full queue (nonzero: the counters undercount)"
