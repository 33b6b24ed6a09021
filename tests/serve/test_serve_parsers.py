"""Both of uvicorn's HTTP parsers under the ``ConnectionGuard``: httptools (the C parser, taken where it is
installed) and h11 serve the same request, keep a connection alive across two requests, and close a
connection that never finishes its headers after ``timeout_headers``. Loopback, a few connections."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest
import uvicorn

from graphtop.server import connections
from graphtop.server.connections import ConnectionGuard, guarded_protocol

PARSERS = ["h11"] + (["httptools"] if connections.HttpToolsProtocol is not None else [])


async def _app(scope: dict, receive: Any, send: Any) -> None:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    answer = b"got " + body
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(answer)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


def _serve(parser: str, guard: ConnectionGuard) -> tuple[uvicorn.Server, threading.Thread, int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(_app, log_config=None, lifespan="off", http=guarded_protocol(guard, parser))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started
    return server, thread, sock.getsockname()[1]


def _request(conn: socket.socket, body: bytes) -> bytes:
    conn.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    data = b""
    while not data.endswith(b"got " + body):
        chunk = conn.recv(4096)
        assert chunk, f"closed after {data!r}"
        data += chunk
    return data


@pytest.mark.parametrize("parser", PARSERS)
def test_each_parser_serves_keeps_alive_and_closes_a_connection_without_headers(parser: str) -> None:
    guard = ConnectionGuard(cap=16, timeout_headers=0.5)
    server, thread, port = _serve(parser, guard)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            assert _request(conn, b"one").startswith(b"HTTP/1.1 200 ")
            assert _request(conn, b"two").startswith(b"HTTP/1.1 200 ")  # the same connection, kept alive
        with socket.create_connection(("127.0.0.1", port), timeout=5) as slow:
            slow.sendall(b"POST / HTTP/1.1\r\nHost")  # and never the rest
            started = time.monotonic()
            assert slow.recv(4096) == b""  # closed by the guard
            assert 0.3 < time.monotonic() - started < 4
    finally:
        server.should_exit = True
        thread.join(10)


def test_an_unknown_parser_is_refused() -> None:
    with pytest.raises(ValueError, match="no HTTP parser"):
        guarded_protocol(ConnectionGuard(cap=1, timeout_headers=1), "picohttp")
