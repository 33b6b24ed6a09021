"""The web dashboard's server without a browser: who gets in (token, origin, host), the tab cap, a closed
or slow tab. Tabs here run a plain ``sleep`` instead of ``graphtop attach`` (the server only relays a
process's bytes; the real dashboard in a real browser is test_web_browser.py), so each test takes a
second or two."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time

import pytest
from aiohttp import WSServerHandshakeError
from aiohttp.test_utils import TestClient, TestServer

from graphtop.cli.endpoint import TOKEN_ENV
from graphtop.cli.web_access import WebAccess, origin_problem
from graphtop.cli.web_server import WebDashboard, WebOptions
from graphtop.cli.web_tabs import TabCommand, TabProcess

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="tabs are POSIX processes")


class SleepTab(TabCommand):
    """A tab whose process ignores the quit request (as a hung dashboard would) and leaves its pid in a file."""

    def shell(self) -> str:
        return f"echo $$ > {self.endpoint}; trap '' TERM; exec sleep 60"


def dashboard(tmp_path, token=None, **options) -> WebDashboard:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    access = WebAccess(token)
    opts = WebOptions(stop_timeout_s=0.5, **options)
    return WebDashboard(SleepTab(str(tmp_path / "pid"), "endpoint-token"), access, opts, sock)


async def client(dash: WebDashboard) -> TestClient:
    c = TestClient(TestServer(dash.app(), host="127.0.0.1"))
    await c.start_server()
    return c


def test_the_token_rule_by_address() -> None:
    assert WebAccess.for_address("127.0.0.1", None) == WebAccess()
    assert WebAccess.for_address("localhost", None).token is None
    assert WebAccess.for_address("127.0.0.1", "key") == WebAccess("key")  # a key given holds on loopback too
    assert WebAccess.for_address("0.0.0.0", "key") == WebAccess("key")
    made = WebAccess.for_address("0.0.0.0", None)
    again = WebAccess.for_address("0.0.0.0", None)
    assert made.printed and len(made.token) >= 32 and made.token != again.token  # a new one each start
    assert made.allows(made.token) and not made.allows("") and not made.allows(None) and not made.allows("x")
    assert not made.allows(made.token[:-1]) and not made.allows("\udcff")  # no crash on a lone surrogate


def test_origin_and_host_checks() -> None:
    assert origin_problem({"Host": "127.0.0.1:8001"}, False) is None
    assert origin_problem({"Host": "127.0.0.1:8001", "Origin": "http://127.0.0.1:8001"}, False) is None
    assert "evil.example" in origin_problem({"Host": "127.0.0.1:8001", "Origin": "http://evil.example"}, False)
    # DNS rebinding: a page of evil.example, its name now pointing at 127.0.0.1, reaching a tokenless dashboard
    rebound = {"Host": "evil.example:8001", "Origin": "http://evil.example:8001"}
    assert "this machine only" in origin_problem(rebound, False)
    assert origin_problem(rebound, True) is None  # with a token, the token decides


async def test_no_token_no_page_no_process(tmp_path) -> None:
    dash = dashboard(tmp_path, token="s3cret")
    c = await client(dash)
    try:
        for path, headers in [
            ("/", {}),
            ("/?token=wrong", {}),
            ("/", {"Authorization": "Bearer wrong"}),
            ("/ws", {}),
            ("/ws/wrong", {}),
        ]:
            r = await c.get(path, headers=headers)
            assert r.status == 401, path
            assert "needs its token" in await r.text() and r.headers["WWW-Authenticate"] == "Bearer"
        with pytest.raises(WSServerHandshakeError) as refused:
            await c.ws_connect("/ws/wrong?width=80&height=24")
        assert refused.value.status == 401
        assert dash.opened == 0 and not (tmp_path / "pid").exists()  # no process was started
        page = await c.get("/?token=s3cret")
        assert page.status == 200 and "/ws/s3cret" in await page.text()
        assert (await c.get("/", headers={"Authorization": "Bearer s3cret"})).status == 200
        assert (await c.get("/static/js/textual.js")).status == 200  # textual-serve's own files are public
    finally:
        await c.close()
        dash.close()


async def test_another_sites_page_cannot_open_a_tab(tmp_path) -> None:
    dash = dashboard(tmp_path)
    c = await client(dash)
    try:
        with pytest.raises(WSServerHandshakeError) as refused:
            await c.ws_connect("/ws", headers={"Origin": "http://evil.example"})
        assert refused.value.status == 403 and dash.opened == 0
    finally:
        await c.close()
        dash.close()


async def _wait_for(check, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.05)


async def test_a_full_dashboard_says_so_and_a_closed_tab_frees_its_process(tmp_path) -> None:
    dash = dashboard(tmp_path, max_tabs=1)
    c = await client(dash)
    try:
        ws = await c.ws_connect("/ws?width=100&height=30")
        pid_file = tmp_path / "pid"
        tab = next(iter(dash.tabs.values()))
        await _wait_for(lambda: tab.pid is not None and pid_file.exists() and pid_file.read_text().strip())
        pid = int(pid_file.read_text())
        assert tab.pid == pid and len(dash.tabs) == 1
        full = await c.get("/")
        page = await full.text()
        assert full.status == 503 and "the dashboard is full" in page and "--max-tabs 1" in page
        with pytest.raises(WSServerHandshakeError) as refused:
            await c.ws_connect("/ws")
        assert refused.value.status == 503 and dash.opened == 1
        await ws.close()  # the tab is closed: its process ignores quit and SIGTERM, and is killed
        await _wait_for(lambda: not dash.tabs)
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        assert (await c.get("/")).status == 200  # room again
    finally:
        await c.close()
        dash.close()


async def test_a_tab_that_takes_no_output_is_closed(tmp_path) -> None:
    never = asyncio.Event()
    closed = asyncio.Event()

    async def stuck_send(data: object) -> None:
        await never.wait()  # a browser that reads nothing: the send never completes

    async def close() -> None:
        closed.set()

    from textual_serve.download_manager import DownloadManager

    tab = TabProcess(
        TabCommand("ipc:///nowhere", "t"),
        write_bytes=stuck_send,
        write_str=stuck_send,
        close=close,
        download_manager=DownloadManager(),
        send_timeout_s=0.2,
        stop_timeout_s=0.2,
    )
    started = time.monotonic()
    await tab.on_data(b"frame")
    await asyncio.wait_for(closed.wait(), 2.0)
    assert tab.too_slow and time.monotonic() - started < 1.5
    await asyncio.wait_for(tab.on_data(b"more"), 0.1)  # later output is dropped at once, not waited on


def test_a_tab_gets_the_token_in_its_environment_not_its_command_line() -> None:
    command = TabCommand("ipc:///x.sock", "tok-123", max_queued=7, theme="graphtop-light")
    shell = command.shell()
    assert "tok-123" not in shell and "--browser-tab" in shell and "--max-queued-requests 7" in shell
    env = command.environment({"PATH": "/bin", "GRAPHTOP_API_KEY": "api", TOKEN_ENV: "old"})
    assert env[TOKEN_ENV] == "tok-123" and "GRAPHTOP_API_KEY" not in env and env["PATH"] == "/bin"
