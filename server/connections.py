"""The server's connections: how long one may take to send a request's headers, how many may be open, and
what happens when the process runs out of file descriptors.

uvicorn alone leaves three holes. Its keep-alive timeout starts only after a response, so a client that
opens a connection and sends half a header line (slowloris) holds it forever. Its ``limit_concurrency``
answers 503 to every new request once the connections are many, ``/health`` included, so idle
connections would starve the probe that should see the server is fine. And once the open-file limit is
reached, asyncio's accept loop reports ``Too many open files`` with a traceback, every second, for as
long as the flood lasts.

``ConnectionGuard`` closes those: every connection must finish a request's headers within
``timeout_headers`` of opening (or of its last response); past ``cap`` open connections the oldest one
that is only waiting (for headers, or idle between requests) is closed to make room, so a client that
sends its request at once always gets in; and accept errors are logged once per interval, without a
traceback, each one shedding idle connections. ``guarded_protocol`` is the uvicorn protocol class that
applies it.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import resource
import time
from collections import OrderedDict
from typing import Any, ClassVar, Optional

from uvicorn.protocols.http.h11_impl import H11Protocol

try:  # uvicorn's C parser (llhttp): a request's framing costs a fraction of h11's pure Python
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools not installed: h11 serves the same requests
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

log = logging.getLogger("graphtop.serve")

ACCEPT_BATCH = 64
"""The listen backlog, which asyncio also takes as the most connections it accepts in one go, before any of
them reaches the guard (their ``connection_made`` runs a loop turn later)."""
FILES_RESERVE = 64 + 3 * ACCEPT_BATCH
"""File descriptors kept free beyond those open when the server starts: logs, a trace, the engine's, a
batch accepted before the guard counts it, the batch before it, and the connections those closed to make
room (a closed transport frees its descriptor a loop turn later)."""
LOG_INTERVAL_S = 10.0
"""A repeated connection-level problem is logged at most once per interval, with the count held back."""
SHED = 16
"""Idle connections closed per accept error, so the next accept finds a descriptor."""
_ACCEPT_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
_BUSY = json.dumps(
    {
        "error": {
            "message": "the server has too many connections open; retry later",
            "type": "service_unavailable",
            "param": None,
            "code": "too_many_connections",
        }
    }
).encode()


def files_cap() -> int:
    """The connections the open-file limit (``ulimit -n``) leaves room for: the soft limit less what is
    open now and a reserve (at least 16)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    try:
        open_now = len(os.listdir("/proc/self/fd"))
    except OSError:
        open_now = 256  # not Linux: a guess on the safe side
    return max(16, soft - open_now - FILES_RESERVE)


class Throttle:
    """At most one line per key per ``interval``; the times held back are counted into the next line."""

    def __init__(self, interval: float = LOG_INTERVAL_S) -> None:
        self.interval = interval
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def due(self, key: str) -> Optional[int]:
        """None while ``key`` was logged within the interval; else how many were held back since."""
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._held[key] = self._held.get(key, 0) + 1
            return None
        self._last[key] = now
        return self._held.pop(key, 0)


class ConnectionGuard:
    """The open connections of one server. ``waiting``: those waiting for a request's headers (new, or
    idle after a response), oldest first: the ones closed to make room."""

    def __init__(self, cap: int, timeout_headers: float) -> None:
        self.cap = cap
        self.timeout_headers = timeout_headers
        self.open: set[Any] = set()
        self.waiting: "OrderedDict[Any, Optional[asyncio.TimerHandle]]" = OrderedDict()
        self.evicted = self.timed_out = self.refused = self.accept_errors = 0
        self.throttle = Throttle()

    def opened(self, conn: Any) -> None:
        self.open.add(conn)
        self.wait_for_headers(conn)
        if len(self.open) <= self.cap:
            return
        victim = next(iter(self.waiting))
        if victim is conn:  # every other connection is mid-request: this one is turned away
            self.refused += 1
            self.closed(conn)
            conn.transport.write(
                b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(_BUSY), _BUSY)
            )
            conn.transport.close()
            return
        self.evicted += 1
        self.headers_came(victim)  # gone from both at once: its connection_lost comes a loop turn later
        self.open.discard(victim)
        victim.transport.close()

    def closed(self, conn: Any) -> None:
        self.open.discard(conn)
        self.headers_came(conn)

    def wait_for_headers(self, conn: Any) -> None:
        """``conn`` must finish a request's headers within the timeout from now."""
        self.headers_came(conn)
        timer = conn.loop.call_later(self.timeout_headers, self._late, conn) if self.timeout_headers > 0 else None
        self.waiting[conn] = timer  # 0: no timeout, but still the first to go when room is needed

    def headers_came(self, conn: Any) -> None:
        timer = self.waiting.pop(conn, None)
        if timer is not None:
            timer.cancel()

    def _late(self, conn: Any) -> None:
        if conn in self.waiting and not conn.transport.is_closing():
            self.timed_out += 1
            self.headers_came(conn)
            conn.transport.close()

    def shed(self, count: int = SHED) -> int:
        """Close up to ``count`` of the oldest waiting connections; how many were closed."""
        victims = list(self.waiting)[:count]
        for conn in victims:
            self.headers_came(conn)
            self.open.discard(conn)
            conn.transport.close()
        self.evicted += len(victims)
        return len(victims)

    def loop_error(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        """The event loop's exception handler: accept errors shed idle connections and are logged once
        per interval without a traceback; anything else once per interval per message."""
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in _ACCEPT_ERRNOS:
            self.accept_errors += 1
            shed = self.shed()
            held = self.throttle.due(f"accept {exc.errno}")
            if held is not None:
                more = f" ({held} more since the last such line)" if held else ""
                log.warning(
                    "cannot accept connections: %s (%d open; closed %d idle ones)%s",
                    exc.strerror or exc,
                    len(self.open),
                    shed,
                    more,
                )
            return
        message = str(context.get("message") or "event loop error")
        held = self.throttle.due(message)
        if held is not None:
            more = f" ({held} more since the last such line)" if held else ""
            log.error("%s%s", message, more, exc_info=exc if isinstance(exc, BaseException) else None)


class ThrottledLog(logging.Filter):
    """uvicorn's own lines (``Invalid HTTP request received.``, a bug's traceback) at most once per
    interval per message: a flood of bad requests must not print a line, or a traceback, per request."""

    def __init__(self, interval: float = LOG_INTERVAL_S) -> None:
        super().__init__()
        self.throttle = Throttle(interval)

    def filter(self, record: logging.LogRecord) -> bool:
        held = self.throttle.due(str(record.msg))
        if held is None:
            return False
        if held:
            record.msg = f"{record.msg} ({held} more since the last such line)"
        return True


def throttle_uvicorn_log() -> None:
    """Install ``ThrottledLog`` on uvicorn's error logger, once per process."""
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, ThrottledLog) for f in logger.filters):
        logger.addFilter(ThrottledLog())


class Guarded:
    """A uvicorn HTTP protocol under a ``ConnectionGuard``: headers timed from the connection's opening
    and from each response on, and the connection counted against the cap. Mixed into uvicorn's httptools
    or h11 protocol (both make a new ``cycle`` when a request's headers are complete)."""

    guard: ClassVar[ConnectionGuard]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.guard.opened(self)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.guard.closed(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        super().data_received(data)
        self._started(cycle)

    def on_response_complete(self) -> None:
        cycle = self.cycle
        if not self.transport.is_closing():
            self.guard.wait_for_headers(self)  # the next request's headers are timed from now
        super().on_response_complete()
        self._started(cycle)

    def _started(self, before: Any) -> None:
        """A new request's headers arrived (uvicorn made a new cycle): no longer waiting."""
        if self.cycle is not before and self.cycle is not None:
            self.guard.headers_came(self)


def guarded_protocol(guard: ConnectionGuard, parser: Optional[str] = None) -> type:
    """A protocol class for uvicorn's ``Config(http=...)`` bound to ``guard`` (one per server). ``parser``:
    "httptools" or "h11"; None takes httptools where it is installed."""
    if parser is None:
        parser = "h11" if HttpToolsProtocol is None else "httptools"
    if parser not in ("httptools", "h11") or (parser == "httptools" and HttpToolsProtocol is None):
        raise ValueError(f"no HTTP parser {parser!r} here")
    base = HttpToolsProtocol if parser == "httptools" else H11Protocol
    return type(f"Guarded{base.__name__}", (Guarded, base), {"guard": guard})
