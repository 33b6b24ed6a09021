"""The web dashboard's HTTP server: the dashboard page, its websocket, and textual-serve's static files.

Each browser tab that opens the websocket gets its own ``graphtop attach`` process (``web_tabs``): a
viewer of the engine's telemetry endpoint like any other, so the engine never waits for a tab. The
server runs on its own thread and event loop (aiohttp, textual-serve's framework), beside the API's
uvicorn loop in ``graphtop serve --dashboard`` and alone in ``graphtop web``.

Every request passes the checks of ``web_access`` first (origin, then token): a refused one gets its
status and a short page, and costs no process. Past ``max_tabs`` open tabs, the page says the dashboard
is full (503) and the websocket is refused the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import logging
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any, Optional
from urllib.parse import quote

import textual_serve
from aiohttp import WSMsgType, web
from textual_serve.download_manager import DownloadManager

from graphtop.server.addresses import url_host

from .web_access import WebAccess, origin_problem
from .web_tabs import TabCommand, TabProcess

log = logging.getLogger("graphtop.web")

PAGES = Path(__file__).with_name("web_pages")
STATIC = Path(textual_serve.__file__).with_name("static")
DEFAULT_PORT = 8001
"""One above the API's 8000, so ``graphtop serve --dashboard`` takes both without a flag."""
DEFAULT_MAX_TABS = 16
MAX_COLUMNS, MAX_ROWS = 1000, 500
"""A tab's terminal size is clamped to these (the browser sends it; a huge one would cost the process)."""
MAX_WS_MESSAGE = 1 << 20
"""A keystroke or a paste: the engine's endpoint takes no prompt over 1 MiB either."""


@dataclass(frozen=True)
class WebOptions:
    """Where the dashboard listens and how many tabs it serves. ``send_timeout_s``: a tab that takes no
    output this long is closed; ``stop_timeout_s``: each step of stopping a tab's process may take this."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    max_tabs: int = DEFAULT_MAX_TABS
    send_timeout_s: float = 10.0
    stop_timeout_s: float = 3.0
    label: str = "engine"

    def __post_init__(self) -> None:
        if self.max_tabs < 1:
            raise ValueError(f"max_tabs must be >= 1, got {self.max_tabs}")


def _page(name: str, **values: str) -> str:
    return Template((PAGES / name).read_text(encoding="utf-8")).substitute(
        {k: html.escape(v, quote=True) for k, v in values.items()}
    )


def _notice(status: int, title: str, message: str, **headers: str) -> web.Response:
    return web.Response(
        status=status,
        text=_page("notice.html", title=title, message=message),
        content_type="text/html",
        headers=headers,
    )


def _size(value: Optional[str], default: int, most: int) -> int:
    try:
        return max(1, min(int(value or default), most))
    except ValueError:
        return default


class WebDashboard:
    """The server of one engine's web dashboard; ``start`` serves on ``sock`` (bound by the caller, so a
    port in use is reported before anything loads), ``close`` stops it and every tab's process."""

    def __init__(self, command: TabCommand, access: WebAccess, options: WebOptions, sock: socket.socket) -> None:
        self.command, self.access, self.options, self.sock = command, access, options, sock
        self.tabs: dict[int, TabProcess] = {}
        self.opened = 0  # tabs ever opened (a tab's key)
        self._sockets: set[web.WebSocketResponse] = set()
        self._downloads = DownloadManager()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._stopped = threading.Event()

    # -- the address -------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    @property
    def url(self) -> str:
        """The URL to open (with the token when one was made here: it is shown nowhere else)."""
        url = f"http://{url_host(self.options.host)}:{self.port}/"
        if self.access.printed and self.access.token:
            url += f"?token={quote(self.access.token, safe='')}"
        return url

    # -- the app -----------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 10)
        app.add_routes(
            [
                web.get("/", self.index),
                web.get("/ws", self.websocket),
                web.get("/ws/{token}", self.websocket),
                web.static("/static", STATIC),
            ]
        )
        app.on_shutdown.append(self._close_tabs)
        return app

    def _refusal(self, request: web.Request, token: Optional[str] = None) -> Optional[web.Response]:
        """The response that refuses ``request`` (origin, token), or None when it may go on."""
        problem = origin_problem(request.headers, self.access.token is not None)
        if problem:
            return _notice(403, "not from here", problem)
        if not self.access.allows(self.access.token_of(request.headers, request.query, token)):
            return _notice(
                401,
                "token needed",
                "This dashboard needs its token: open the URL that graphtop printed when it started "
                "(…/?token=…), or send Authorization: Bearer with the server's API key.",
                **{"WWW-Authenticate": "Bearer"},
            )
        return None

    def _full(self) -> Optional[web.Response]:
        if len(self.tabs) < self.options.max_tabs:
            return None
        return _notice(
            503,
            "the dashboard is full",
            f"{len(self.tabs)} browser tabs are watching this engine, the most this dashboard serves "
            f"(--max-tabs {self.options.max_tabs}). Close one of them and reload this page.",
            **{"Retry-After": "5"},
        )

    async def index(self, request: web.Request) -> web.Response:
        refused = self._refusal(request) or self._full()
        if refused is not None:
            return refused
        ws_url = f"ws://{request.host}/ws"
        if self.access.token is not None:
            ws_url += "/" + quote(self.access.token_of(request.headers, request.query), safe="")
        body = _page(
            "dashboard.html",
            label=self.options.label,
            websocket_url=ws_url,
            font_size=str(_size(request.query.get("fontsize"), 16, 64)),
        )
        return web.Response(
            text=body,
            content_type="text/html",
            headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"},
        )

    async def websocket(self, request: web.Request) -> web.StreamResponse:
        refused = self._refusal(request, request.match_info.get("token")) or self._full()
        if refused is not None:
            return refused
        self.opened += 1
        key = self.opened
        ws = web.WebSocketResponse(heartbeat=15, max_msg_size=MAX_WS_MESSAGE)
        tab = TabProcess(
            self.command,
            write_bytes=ws.send_bytes,
            write_str=ws.send_str,
            close=ws.close,
            download_manager=self._downloads,
            send_timeout_s=self.options.send_timeout_s,
            stop_timeout_s=self.options.stop_timeout_s,
        )
        self.tabs[key] = tab  # before any await: the cap counts it from here
        try:
            await ws.prepare(request)
            self._sockets.add(ws)
            width = _size(request.query.get("width"), 80, MAX_COLUMNS)
            height = _size(request.query.get("height"), 24, MAX_ROWS)
            await tab.start(width, height)
            log.info("browser tab %d opened (%d open)", key, len(self.tabs))
            await self._relay(ws, tab)
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # one tab's failure ends that tab only
            log.warning("browser tab %d: %s", key, exc)
        finally:
            self._sockets.discard(ws)
            await tab.stop()
            with contextlib.suppress(Exception):
                await ws.close()
            self.tabs.pop(key, None)
            log.info("browser tab %d closed (%d open)", key, len(self.tabs))
        return ws

    @staticmethod
    async def _relay(ws: web.WebSocketResponse, tab: TabProcess) -> None:
        """The browser's keys, size changes, focus and pings to the tab's process (textual-serve's
        envelope: ``[type, data]``); anything else is ignored."""
        async for message in ws:
            if message.type != WSMsgType.TEXT:
                continue
            try:
                envelope = json.loads(message.data)
                kind, data = envelope[0], envelope[1] if len(envelope) > 1 else None
            except (ValueError, TypeError, IndexError, KeyError):
                continue
            if kind == "stdin" and isinstance(data, str):
                await tab.send_bytes(data.encode("utf-8", "replace"))
            elif kind == "resize" and isinstance(data, dict):
                await tab.set_terminal_size(
                    _size(str(data.get("width")), 80, MAX_COLUMNS), _size(str(data.get("height")), 24, MAX_ROWS)
                )
            elif kind == "ping":
                await ws.send_json(["pong", data])
            elif kind == "blur":
                await tab.blur()
            elif kind == "focus":
                await tab.focus()

    async def _close_tabs(self, app: Any) -> None:
        for ws in list(self._sockets):
            with contextlib.suppress(Exception):
                await ws.close(code=1001, message=b"graphtop web stopped")

    # -- running -----------------------------------------------------------------------------------
    def start(self) -> "WebDashboard":
        """Serve on a thread of its own; returns once the server accepts connections."""
        ready = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            runner = web.AppRunner(self.app(), handle_signals=False, access_log=None, shutdown_timeout=2.0)
            try:
                loop.run_until_complete(runner.setup())
                loop.run_until_complete(web.SockSite(runner, self.sock).start())
            except BaseException as exc:  # noqa: BLE001 - reported to start()
                failed.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(runner.cleanup())
                loop.close()
                self._stopped.set()

        self._thread = threading.Thread(target=run, name="graphtop-web", daemon=True)
        self._thread.start()
        ready.wait()
        if failed:
            raise failed[0]
        return self

    def close(self) -> None:
        """Stop serving: every tab is closed and its process stopped. Idempotent."""
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            thread.join(self.options.stop_timeout_s * 3 + 5)
        self.sock.close()
