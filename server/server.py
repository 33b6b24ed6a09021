"""Runs the API with uvicorn on a thread of its own, beside an engine serving on its background thread.

The two never wait for each other: uvicorn's event loop runs in its thread, the engine steps in its
own, and tokens cross over through ``loop.call_soon_threadsafe`` (``generation``). The listening socket
is bound first (``listen``), before a model is loaded: a port in use is a one-line error that costs no
load, and port 0 picks a free port that ``url`` then names.

They do share the GIL. The event loop's Python (HTTP parsing, validation, JSON and SSE framing) runs
while the engine's thread steps, and the step thread takes the GIL back after every torch call and
kernel launch: at CPython's 5 ms switch interval each take-back can wait that long for the loop, which
adds whole intervals to a step, to TTFT and to the inter-token latency. While the server runs the
interval is at most ``SWITCH_INTERVAL_S`` (engine/switch_interval.py).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from typing import Any, Optional

import uvicorn

from graphtop.engine import switch_interval
from graphtop.engine.telemetry.metrics import MetricsCollector

from .app import create_app
from .options import ServeOptions

log = logging.getLogger("graphtop.serve")

START_TIMEOUT_S = 30.0
GRACEFUL_SHUTDOWN_S = 2
SWITCH_INTERVAL_S = 0.0002
"""The interpreter's switch interval while the server runs: the longest the engine's thread waits for the
GIL while the event loop runs Python (docs/benchmarks.md: the HTTP API's latency)."""


class ServeError(Exception):
    """The server cannot start (the address cannot be bound, ...); the message is one line."""


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (IPv6 for an address with a colon); ServeError if it
    cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(2048)
    except (OSError, OverflowError) as e:
        sock.close()
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ServeError(f"cannot listen on {host}:{port}: {why}") from None
    sock.set_inheritable(False)
    return sock


class ApiServer:
    """The OpenAI-compatible API of ``engine`` on ``options.host:options.port`` (or on ``sock``, bound
    earlier by ``listen``). ``metrics``: a collector subscribed before the engine was built (so capture
    costs are counted); one is made here otherwise. ``start()`` returns once the server accepts
    connections; ``close()`` stops it (the engine is the caller's to close)."""

    def __init__(
        self,
        engine: Any,
        options: Optional[ServeOptions] = None,
        *,
        metrics: Optional[MetricsCollector] = None,
        sock: Optional[socket.socket] = None,
    ) -> None:
        self.engine = engine
        self.options = options = options if options is not None else ServeOptions()
        self._own_metrics = metrics is None
        self.metrics = metrics if metrics is not None else MetricsCollector(engine.bus)
        self.sock = sock if sock is not None else listen(options.host, options.port)
        self.app = create_app(engine, options, self.metrics)
        config = uvicorn.Config(
            self.app,
            log_config=None,
            log_level="warning",
            access_log=False,
            lifespan="off",
            loop="asyncio",
            http="h11",
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        )
        self._server = uvicorn.Server(config)
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self._switch_ask: Optional[int] = None

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    @property
    def url(self) -> str:
        """The base URL clients use (``…/v1`` is the OpenAI base URL)."""
        host = self.options.host
        if host in ("0.0.0.0", ""):
            host = "127.0.0.1"
        elif host in ("::", "[::]"):
            host = "[::1]"
        elif ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def start(self, timeout: float = START_TIMEOUT_S) -> "ApiServer":
        if self._thread is not None:
            return self
        self._switch_ask = switch_interval.at_most(SWITCH_INTERVAL_S)
        self._thread = threading.Thread(target=self._run, name="graphtop-api", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.close()
                raise ServeError(f"the API server did not start: {self._error or 'timed out'}")
            time.sleep(0.01)
        return self

    def _run(self) -> None:
        try:
            asyncio.run(self._server.serve(sockets=[self.sock]))
        except BaseException as e:  # reported by start(); a running server logs its own errors
            self._error = e
            log.exception("the API server stopped")

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def close(self, timeout: float = GRACEFUL_SHUTDOWN_S + 3.0) -> None:
        """Stop accepting, give open requests a moment, stop. Idempotent."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        switch_interval.release(self._switch_ask)
        self._switch_ask = None
        try:
            self.sock.close()
        except OSError:
            pass
        if self._own_metrics:
            self.metrics.close()

    def __enter__(self) -> "ApiServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
