"""Slowloris against ``graphtop serve``: 1,100 connections on loopback that never finish their headers, to a
server allowed 1,024 open files, cannot starve ``/health``, and the server prints no traceback (a few lines
at most) and stops cleanly. With the connection cap left to the file limit the flood never reaches it; with
a cap above it (``--max-connections 5000``) the accept loop runs out of descriptors, and that is one line,
idle connections closed to make room. Bounded in count and time."""

from __future__ import annotations

import re
import resource
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from support.serve_support import TIMEOUT_S
from test_serve_cli import SMALL
from test_serve_lifecycle import drain, lines_of, serve_env, wait_for

FILES = 1024
CONNECTIONS = 1100
FLOOD_S = 60.0


@pytest.fixture
def room_for_the_flood():
    """The test process itself holds every connection: its own file limit must leave room for them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = CONNECTIONS + 256
    if soft >= need:
        yield
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"the open-file limit ({hard}) leaves no room for {CONNECTIONS} connections")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _few_files() -> None:  # in the server's process, before it starts: ulimit -n 1024
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (FILES, hard))


def _flood(port: int) -> list[socket.socket]:
    socks = []
    deadline = time.monotonic() + FLOOD_S
    while len(socks) < CONNECTIONS and time.monotonic() < deadline:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # and never more
        except OSError:
            continue  # the server closed it to make room, or the queue was full: the next one
        socks.append(sock)
    return socks


@pytest.mark.parametrize("extra", [[], ["--max-connections", "5000"]], ids=["cap-by-file-limit", "cap-above-it"])
def test_half_open_connections_cannot_starve_health(demo_cache, room_for_the_flood, extra) -> None:
    argv = ["serve", "--port", "0", *SMALL, "--disable-log-requests", "--timeout-headers", "60", *extra]
    proc = subprocess.Popen(
        [sys.executable, "-m", "graphtop.cli.entry", *argv],
        env=serve_env(demo_cache),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_few_files,
    )
    err = lines_of(proc.stderr)
    logged: list[str] = []
    socks: list[socket.socket] = []
    try:
        serving = wait_for(err, logged, lambda line: "serving demo at" in line)
        url = re.search(r"at (http://127\.0\.0\.1:\d+)/v1 ", serving).group(1)
        port = int(url.rsplit(":", 1)[1])
        socks = _flood(port)
        assert len(socks) >= CONNECTIONS * 0.9, len(socks)
        for _ in range(3):
            started = time.monotonic()
            assert httpx.get(f"{url}/health", timeout=TIMEOUT_S).json() == {"status": "ok"}
            assert time.monotonic() - started < 10
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(TIMEOUT_S) == 0
    finally:
        for sock in socks:
            sock.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    time.sleep(0.2)
    logged = drain(err, logged)
    assert not [line for line in logged if "Traceback" in line], logged
    assert len(logged) < 10, logged
    if extra:
        emfile = [line for line in logged if "cannot accept connections: Too many open files" in line]
        assert 1 <= len(emfile) <= 3, logged
