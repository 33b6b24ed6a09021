"""Many viewers with the token attaching at once all get in, whatever garbage comes at the same time.

The endpoint bounds the connections in their handshake (``max_pending``, for the pre-auth memory
bound, ``test_endpoint_gate.py``); these tests show that bound locks no viewer out: 50 and 200 real
``RemoteSession`` viewers attach at once, alone and during a burst of 300 connections that send 5
bytes of a greeting and then wait (loopback only; the burst outlasts the attach, its handshake
timeout set longer than the test so that nobody gets in by waiting it out).
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any, Optional

import pytest
from support.waiting import wait_for

from graphtop.engine.telemetry.bus import EventBus
from graphtop.engine.telemetry.descriptors import make_room_for
from graphtop.engine.telemetry.events import StepEvent
from graphtop.engine.telemetry.server import EndpointConfig, TelemetryServer
from graphtop.tui.sessions.remote import AttachError, RemoteSession

ATTACH_S = 30.0  # each viewer's connect timeout: a bound for a loaded CI machine, not the expected time


@pytest.fixture
def serve(tmp_path_factory: pytest.TempPathFactory):
    runtime: Path = tmp_path_factory.mktemp("rt")
    servers: list[TelemetryServer] = []

    def make(**config: Any) -> TelemetryServer:
        server = TelemetryServer(EventBus(), EndpointConfig(runtime_dir=runtime, label="crowd", **config))
        servers.append(server)
        return server

    yield make
    for s in servers:
        s.close()


def half_greetings(endpoint: str, count: int) -> list[socket.socket]:
    """``count`` connections that each send 5 bytes of ZeroMQ's 64-byte greeting and then say nothing."""
    out = []
    for _ in range(count):
        if endpoint.startswith("tcp://"):
            host, port = endpoint[len("tcp://") :].rsplit(":", 1)
            s = socket.create_connection((host, int(port)), timeout=5)
        else:
            s = socket.socket(socket.AF_UNIX)
            s.connect(endpoint[len("ipc://") :])  # blocking: a full backlog waits for the endpoint's accepts
        try:
            s.sendall(b"\xff\x00\x00\x00\x00")
        except OSError:  # the endpoint already shut it (more than max_pending at once): what it may do
            pass
        out.append(s)
    return out


def attach_all(server: TelemetryServer, count: int) -> tuple[list[RemoteSession], list[str], float]:
    """``count`` viewers attach at once (one thread each, released together); the sessions, the
    errors, and the seconds until the last one got its Welcome."""
    sessions = [RemoteSession(server.endpoint, server.token, connect_timeout=ATTACH_S) for _ in range(count)]
    errors: list[str] = []
    go = threading.Barrier(count + 1)

    def one(session: RemoteSession) -> None:
        go.wait()
        try:
            session.connect()
        except AttachError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=one, args=(s,), daemon=True) for s in sessions]
    for t in threads:
        t.start()
    go.wait()
    started = time.monotonic()
    for t in threads:
        t.join(ATTACH_S + 10)
    return sessions, errors, time.monotonic() - started


def close_all(sessions: list[RemoteSession]) -> None:
    """Detach them all at once (one by one, 200 viewers take seconds to say Bye)."""
    threads = [threading.Thread(target=s.shutdown, daemon=True) for s in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)


@pytest.mark.parametrize(
    "viewers, garbage, address",
    [(50, 0, "tcp"), (50, 300, "tcp"), (200, 0, "tcp"), (200, 300, "tcp"), (200, 300, "ipc")],
)
def test_every_viewer_with_the_token_gets_in(serve, viewers: int, garbage: int, address: str) -> None:
    if make_room_for(4 * (viewers + garbage)) < 4 * (viewers + garbage) and make_room_for(0) != -1:
        pytest.skip("the open-file limit is too low for this many connections in one process")
    server = serve(address="tcp://127.0.0.1:*" if address == "tcp" else "ipc", handshake_s=120.0)
    junk: Optional[list[socket.socket]] = half_greetings(server.endpoint, garbage) if garbage else None
    try:
        sessions, errors, took = attach_all(server, viewers)
        try:
            assert errors == [], f"{len(errors)} of {viewers} viewers did not get in: {sorted(set(errors))}"
            wait_for(lambda: len(server.viewers) == viewers, 10, f"the endpoint to count {viewers} viewers")
            server.bus.publish(StepEvent(step=1))  # and each is served the live stream
            for s in sessions:
                wait_for(lambda s=s: any(e.type == "step" for e in s.drain()), 10, "a step event")
        finally:
            close_all(sessions)
    finally:
        for s in junk or []:
            s.close()
    if garbage:  # the bound was in force: the half-greetings past it were shut, and locked no viewer out
        bound = server.config.max_pending
        wait_for(lambda: server.gate.refused_connections >= garbage - bound, 10, "the burst past the bound to be shut")
    print(f"{viewers} viewers, {garbage} half-greetings on {address}: all in after {took:.2f} s")


def test_a_viewer_past_the_cap_is_told_why(serve) -> None:
    server = serve(max_viewers=2)
    sessions = [RemoteSession(server.endpoint, server.token) for _ in range(3)]
    try:
        sessions[0].connect()
        sessions[1].connect()
        with pytest.raises(AttachError, match="2 viewers are attached, the most this endpoint serves at once"):
            sessions[2].connect()
    finally:
        for s in sessions:
            s.shutdown()


def test_a_hello_said_twice_on_one_connection_is_welcomed_once(serve) -> None:
    import zmq

    from graphtop.engine.telemetry import protocol as p
    from graphtop.engine.telemetry import wire

    server = serve()
    ctx = zmq.Context()
    sock = wire.viewer_socket(ctx, server.token, "twice")
    try:
        sock.connect(server.endpoint)
        hello = p.encoder.encode(p.Hello(p.PROTOCOL_VERSION, server.token, "twice"))
        sock.send(hello)
        sock.send(hello)
        kinds: list[str] = []
        deadline = time.monotonic() + 10
        while "Snapshot" not in kinds and time.monotonic() < deadline:
            if sock.poll(100):
                kinds.append(type(p.server_decoder.decode(sock.recv())).__name__.removeprefix("Raw"))
        while sock.poll(300):  # a second Welcome would come right behind the first
            kinds.append(type(p.server_decoder.decode(sock.recv())).__name__.removeprefix("Raw"))
        assert kinds.count("Welcome") == 1 and kinds.count("Snapshot") == 1, kinds
        assert len(server.viewers) == 1
    finally:
        sock.close(0)
        ctx.term()
