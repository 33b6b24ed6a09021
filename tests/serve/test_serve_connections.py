"""``ConnectionGuard`` alone, on stand-in connections: which connection makes room past the cap, a new one
turned away with a 503 when every other is mid-request, and accept errors and uvicorn's own lines logged
once per interval without a traceback however often they come."""

from __future__ import annotations

import asyncio
import errno
import logging
from typing import Any

from graphtop.server.connections import ConnectionGuard, ThrottledLog


class _Transport:
    def __init__(self) -> None:
        self.closed = False
        self.written = b""

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def write(self, data: bytes) -> None:
        self.written += data


class _Conn:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport = _Transport()


def test_the_oldest_waiting_connection_makes_room_and_a_new_one_is_refused_when_none_waits() -> None:
    loop = asyncio.new_event_loop()
    try:
        guard = ConnectionGuard(cap=2, timeout_headers=60)
        a, b, c, d = (_Conn(loop) for _ in range(4))
        guard.opened(a)
        guard.opened(b)
        guard.opened(c)
        assert a.transport.closed and not b.transport.closed and not c.transport.closed and guard.evicted == 1
        guard.headers_came(b)  # b and c are mid-request now
        guard.headers_came(c)
        guard.opened(d)
        assert d.transport.closed and d.transport.written.startswith(b"HTTP/1.1 503 ")
        assert b"too_many_connections" in d.transport.written and guard.refused == 1
        assert not b.transport.closed and not c.transport.closed
        guard.wait_for_headers(b)  # b answered: idle again, the first to go
        assert guard.shed(1) == 1 and b.transport.closed
    finally:
        loop.close()


def test_accept_errors_are_one_line_per_interval_without_a_traceback(caplog) -> None:
    caplog.set_level(logging.INFO, logger="graphtop.serve")
    loop = asyncio.new_event_loop()
    try:
        guard = ConnectionGuard(cap=100, timeout_headers=60)
        idle = [_Conn(loop) for _ in range(20)]
        for conn in idle:
            guard.opened(conn)
        for _ in range(1000):
            exc = OSError(errno.EMFILE, "Too many open files")
            guard.loop_error(loop, {"message": "socket.accept() out of system resource", "exception": exc})
        for _ in range(50):
            guard.loop_error(loop, {"message": "something else", "exception": ValueError("x")})
    finally:
        loop.close()
    records = [r for r in caplog.records if r.name == "graphtop.serve"]
    accept = [r for r in records if "cannot accept connections: Too many open files" in r.getMessage()]
    assert len(accept) == 1 and accept[0].exc_info is None
    other = [r for r in records if "something else" in r.getMessage()]
    assert len(other) == 1  # with its traceback, once
    assert guard.accept_errors == 1000 and all(c.transport.closed for c in idle)  # idle ones shed


def test_uvicorns_own_lines_are_throttled() -> None:
    keep = ThrottledLog(interval=60)

    def record(msg: str) -> Any:
        return logging.LogRecord("uvicorn.error", logging.WARNING, __file__, 1, msg, (), None)

    passed = [keep.filter(record("Invalid HTTP request received.")) for _ in range(500)]
    assert passed.count(True) == 1
    assert keep.filter(record("Exception in ASGI application\n"))
