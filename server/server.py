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
import math
import socket
import threading
import time
from typing import Any, Callable, Optional

import uvicorn

from graphtop.engine import switch_interval
from graphtop.engine.telemetry.metrics import MetricsCollector

from .access import RequestTracker
from .addresses import url_host
from .app import Serving, create_app
from .connections import ACCEPT_BATCH, ConnectionGuard, files_cap, guarded_protocol, throttle_uvicorn_log
from .options import ServeOptions

log = logging.getLogger("graphtop.serve")

START_TIMEOUT_S = 30.0
LISTEN_BACKLOG = 2048
"""Connections the kernel queues before they are accepted (uvicorn's default)."""
SHUTDOWN_MARGIN_S = 2.0
"""After the shutdown's wait, this long for the ended streams to send their last chunk before uvicorn
cancels what is left."""
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
        sock.listen(LISTEN_BACKLOG)
    except (OSError, OverflowError) as e:
        sock.close()
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ServeError(f"cannot listen on {host}:{port}: {why}") from None
    sock.set_inheritable(False)
    return sock


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, telling ``on_shutdown`` when its shutdown begins (on its event loop)."""

    def __init__(self, config: uvicorn.Config, on_shutdown: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_shutdown = on_shutdown

    async def shutdown(self, sockets: Optional[list[socket.socket]] = None) -> None:
        self._on_shutdown()
        await super().shutdown(sockets)


class ApiServer:
    """The OpenAI-compatible API of ``engine`` on ``options.host:options.port`` (or on ``sock``, bound
    earlier by ``listen``). ``metrics``: a collector subscribed before the engine was built (so capture
    costs are counted); one is made here otherwise. ``start()`` returns once the server accepts
    connections; ``close()`` stops it (the engine is the caller's to close).

    ``engine`` may be None while the model loads (``metrics`` is then needed): every route but
    ``/metrics`` answers 503 until ``attach(engine)``.

    Stopping is graceful: ``close()`` stops accepting, lets the requests in flight finish for
    ``options.shutdown_timeout`` seconds, then ends each one still running (a stream gets a last error
    chunk and ``[DONE]``, a waiting request a 503); ``close(now=True)`` ends them at once."""

    def __init__(
        self,
        engine: Optional[Any],
        options: Optional[ServeOptions] = None,
        *,
        metrics: Optional[MetricsCollector] = None,
        sock: Optional[socket.socket] = None,
    ) -> None:
        if engine is None and metrics is None:
            raise ValueError("an ApiServer without an engine yet needs the metrics collector of its bus")
        self.options = options = options if options is not None else ServeOptions()
        self._own_metrics = metrics is None
        self.metrics = metrics if metrics is not None else MetricsCollector(engine.bus)
        self.sock = sock if sock is not None else listen(options.host, options.port)
        self.serving = Serving(options)
        self.app = create_app(self.serving, self.metrics)
        self.tracker = RequestTracker(self.app, self.metrics.registry, log_requests=options.log_requests)
        cap = options.max_connections if options.max_connections is not None else files_cap()
        self.guard = ConnectionGuard(cap, options.timeout_headers)
        config = uvicorn.Config(
            self.tracker,
            log_config=None,
            log_level="warning",
            access_log=False,
            lifespan="off",
            loop="asyncio",
            http=guarded_protocol(self.guard),
            backlog=ACCEPT_BATCH,
            timeout_keep_alive=options.timeout_keep_alive,  # type: ignore[arg-type]  (a float works)
            timeout_graceful_shutdown=math.ceil(options.shutdown_timeout + SHUTDOWN_MARGIN_S),
        )
        self._server = _Uvicorn(config, self._shutdown_began)
        self._thread: Optional[threading.Thread] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._error: Optional[BaseException] = None
        self._switch_ask: Optional[int] = None
        self._wait_s = options.shutdown_timeout
        self.ended_at_shutdown = 0  # requests still running when the shutdown's wait ran out
        if engine is not None:
            self.attach(engine)

    def attach(self, engine: Any) -> None:
        """The model has loaded and ``engine`` serves on its background thread: answer for it."""
        if self.options.max_connections is None:  # the loaded engine holds files of its own: count again
            self.guard.cap = files_cap() + len(self.guard.open)
        self.serving.attach(engine)

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    @property
    def url(self) -> str:
        """The base URL clients use (``…/v1`` is the OpenAI base URL)."""
        return f"http://{url_host(self.options.host)}:{self.port}"

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
        # asyncio listened with ACCEPT_BATCH, its accept batch: the kernel's queue gets its full size back
        self.sock.listen(LISTEN_BACKLOG)
        return self

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as e:  # reported by start(); a running server logs its own errors
            self._error = e
            log.exception("the API server stopped")

    async def _serve(self) -> None:
        self._loop = loop = asyncio.get_running_loop()
        loop.set_exception_handler(self.guard.loop_error)  # accept errors: no traceback per attempt
        throttle_uvicorn_log()
        await self._server.serve(sockets=[self.sock])

    def _shutdown_began(self) -> None:
        """On the loop, as uvicorn stops accepting: requests in flight get ``_wait_s`` to finish."""
        assert self._loop is not None
        self._loop.call_later(self._wait_s, self._end_requests)

    def _end_requests(self) -> None:
        waited = self.options.shutdown_timeout if self._wait_s else 0
        self.ended_at_shutdown += self.tracker.stop_all(
            f"the server is shutting down: the request was still running after the {waited:g} s shutdown wait"
        )

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def close(self, timeout: Optional[float] = None, *, now: bool = False) -> None:
        """Stop accepting, let the requests in flight finish for ``options.shutdown_timeout`` seconds (none
        with ``now``: a second Ctrl-C), end those still running, stop. Idempotent."""
        if now:
            self._wait_s = 0.0
            if self._server.should_exit and self._loop is not None:  # already waiting: end them now
                try:
                    self._loop.call_soon_threadsafe(self._end_requests)
                except RuntimeError:  # the loop has closed: nothing is running
                    pass
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(self._wait_s + SHUTDOWN_MARGIN_S + 3.0 if timeout is None else timeout)
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
