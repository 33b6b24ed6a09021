"""Every HTTP request, seen from outside the application: an access-log line, the
``graphtop:http_requests_total`` counter, and the generations in flight that a shutdown must end.

``RequestTracker`` is plain ASGI around the whole FastAPI application (so a 401 of the key check, a 404 of
an unknown route and a bug's 500 are seen as a client sees them), not a Starlette ``http`` middleware,
which gets between a stream and the client's disconnect. A handler's ``Generation`` finds the request it
belongs to through a context variable the tracker sets (``note_generation``): the line then carries the
request's token counts, and the tracker knows which streams are open when the server stops.

Labels are bounded: the path is one of the routes the server has (``other`` for anything else), the method
GET, POST or ``other``, the status a number, so a scan of random URLs adds no series.
"""

from __future__ import annotations

import logging
import time
import weakref
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Optional

from prometheus_client import CollectorRegistry, Counter

from graphtop.engine.telemetry.metrics import PREFIX

log = logging.getLogger("graphtop.serve")

ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")
MODEL_ROUTE = "/v1/models/{model}"
METHODS = ("GET", "POST")


def route_label(path: str) -> str:
    """The route template ``path`` matches, or ``other``: the counter's ``path`` label."""
    if path in ROUTES:
        return path
    if path.startswith("/v1/models/") and len(path) > len("/v1/models/"):
        return MODEL_ROUTE
    return "other"


def method_label(method: str) -> str:
    return method if method in METHODS else "other"


_COUNTERS: "weakref.WeakKeyDictionary[CollectorRegistry, Counter]" = weakref.WeakKeyDictionary()


def requests_counter(registry: CollectorRegistry) -> Counter:
    """``graphtop:http_requests_total{method,path,status}`` in ``registry``, registered once however many
    servers share it (the dashboard's collector outlives an API it restarts)."""
    counter = _COUNTERS.get(registry)
    if counter is None:
        counter = Counter(
            PREFIX + "http_requests",
            "HTTP requests answered, by method, route and status",
            ["method", "path", "status"],
            registry=registry,
        )
        _COUNTERS[registry] = counter
    return counter


@dataclass
class RequestRecord:
    """One request as the tracker sees it; ``generation`` once a handler submitted engine requests."""

    tracker: "RequestTracker"
    generation: Any = None
    status: Optional[int] = None
    complete: bool = False
    started: float = field(default_factory=time.perf_counter)


_current: ContextVar[Optional[RequestRecord]] = ContextVar("graphtop_http_request", default=None)


def note_generation(generation: Any) -> None:
    """Called by ``Generation.submit``: ties the generation to the request being served, if any."""
    record = _current.get()
    if record is not None:
        record.generation = generation
        record.tracker.live.add(generation)


class RequestTracker:
    """Plain ASGI around ``app``: counts and logs each HTTP request, and keeps its generations in ``live``
    while it runs (``stop_all`` ends them, the last step of a graceful shutdown)."""

    def __init__(self, app: Any, registry: CollectorRegistry, *, log_requests: bool = True) -> None:
        self.app = app
        self.counter = requests_counter(registry)
        self.log_requests = log_requests
        self.live: set[Any] = set()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = RequestRecord(self)
        token = _current.set(record)

        async def watched_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                record.status = int(message["status"])
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                record.complete = True
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        finally:
            _current.reset(token)
            if record.generation is not None:
                self.live.discard(record.generation)
            self._done(scope, record)

    def stop_all(self, reason: str) -> int:
        """End every generation still in flight (their streams get a last error chunk and [DONE]); how many."""
        live = [g for g in self.live if not g.finished]
        for generation in live:
            generation.stop(reason)
        return len(live)

    def _done(self, scope: dict, record: RequestRecord) -> None:
        status = record.status
        self.counter.labels(
            method_label(scope.get("method", "")),
            route_label(scope.get("path", "")),
            "none" if status is None else str(status),
        ).inc()
        if self.log_requests:
            level = logging.INFO if status is not None and status < 400 else logging.WARNING
            log.log(level, "%s", access_line(scope, record))


def access_line(scope: dict, record: RequestRecord) -> str:
    """``127.0.0.1:52144 POST /v1/completions 200 41.7 ms prompt_tokens=5 completion_tokens=16``."""
    client = scope.get("client")
    who = f"{client[0]}:{client[1]}" if client else "-"
    ms = (time.perf_counter() - record.started) * 1e3
    status = "-" if record.status is None else str(record.status)
    line = f"{who} {_printable(scope.get('method', '-'))} {_printable(scope.get('path', '-'))} {status} {ms:.1f} ms"
    if record.generation is not None:
        prompt, completion = record.generation.token_counts()
        line += f" prompt_tokens={prompt} completion_tokens={completion}"
    if record.status is None:
        line += " (no response: the client left or the server stopped)"
    elif not record.complete:
        line += " (response cut short)"
    return line


def _printable(text: str, limit: int = 200) -> str:
    """A client's text on one line of the log: ``%0A`` in a path is a newline once decoded, and would
    otherwise forge a line of its own."""
    shown = "".join(c if c.isprintable() and c != " " else f"\\x{ord(c):02x}" for c in text[:limit])
    return shown + ("…" if len(text) > limit else "")
