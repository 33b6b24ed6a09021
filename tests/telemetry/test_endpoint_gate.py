"""The telemetry endpoint against clients that do not hold the token (``engine/telemetry/gate.py``).

Such a client could make the engine's process buffer a whole multipart message before its first word
was read: one message of 30 parts of 15 MiB took an engine from 273 MB to 996 MB. Now the token is checked
in ZeroMQ's handshake, a handshake frame is at most 64 KiB, and the connections in their handshake are
capped and timed out. The attackers run in other processes (loopback only, killed after a bound), so
this process's RSS is the engine's.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

import psutil
import pytest
from support.waiting import wait_for

from graphtop.engine.telemetry.bus import EventBus
from graphtop.engine.telemetry.events import StepEvent
from graphtop.engine.telemetry.server import EndpointConfig, TelemetryServer
from graphtop.engine.telemetry.wire import FRAME_BYTES
from graphtop.tui.sessions.remote import RemoteSession

ATTACK = """
import sys, time, zmq
endpoint, password = sys.argv[1], sys.argv[2]
ctx = zmq.Context()
sock = ctx.socket(zmq.DEALER)
sock.setsockopt(zmq.LINGER, 0)
sock.setsockopt(zmq.SNDTIMEO, 5000)  # refused in the handshake before sending: no peer takes the message
if password:  # PLAIN with a wrong token; else ZeroMQ's default NULL mechanism (no token at all)
    sock.setsockopt(zmq.PLAIN_USERNAME, b"x")
    sock.setsockopt_string(zmq.PLAIN_PASSWORD, password)
sock.connect(endpoint)
part = bytes(15 << 20)
try:
    sock.send_multipart([part] * 30, copy=False)  # 450 MiB in one message
except zmq.Again:
    pass
time.sleep(float(sys.argv[3]))
"""


def _zmtp_plain_greeting() -> bytes:
    """ZMTP 3.0's 64-byte greeting of a client that asks for the PLAIN mechanism."""
    return b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"PLAIN".ljust(20, b"\0") + b"\0" + bytes(31)


def _raw_huge_hello(host: str, port: int, stop: threading.Event) -> None:
    """A client that speaks ZMTP itself: a greeting, then a handshake command that says it is 15 MiB long,
    written until the engine hangs up (it should do so after 64 KiB)."""
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(_zmtp_plain_greeting())
        try:
            s.sendall(b"\x06" + struct.pack(">Q", 15 << 20))  # command, long frame
            chunk = bytes(1 << 16)
            for _ in range(240):
                if stop.is_set():
                    return
                s.sendall(chunk)
        except OSError:
            return  # hung up on: what should happen


@pytest.fixture
def serve(tmp_path_factory: pytest.TempPathFactory):
    runtime: Path = tmp_path_factory.mktemp("rt")
    servers: list[TelemetryServer] = []

    def make(bus: Optional[EventBus] = None, **config: Any) -> TelemetryServer:
        server = TelemetryServer(bus or EventBus(), EndpointConfig(runtime_dir=runtime, label="gate", **config))
        servers.append(server)
        return server

    yield make
    for s in servers:
        s.close()


def _attach_and_stream(server: TelemetryServer, bus: EventBus) -> None:
    session = RemoteSession(server.endpoint, server.token)
    try:
        session.connect()
        bus.publish(StepEvent(step=7))
        got: list[Any] = []
        wait_for(lambda: got.extend(session.drain()) or any(e.type == "step" for e in got), 10, "a step event")
    finally:
        session.shutdown()


class PeakRss:
    """This process's resident memory, sampled every 5 ms while in the ``with`` block."""

    def __init__(self) -> None:
        self._proc = psutil.Process()
        self.base = self.peak = self._proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __enter__(self) -> "PeakRss":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)


def test_clients_without_the_token_cannot_make_the_engine_buffer_their_messages(serve) -> None:
    bus = EventBus()
    server = serve(bus, address="tcp://127.0.0.1:*", refusals_per_s=100.0)
    host, port = server.endpoint[len("tcp://") :].rsplit(":", 1)
    _attach_and_stream(server, bus)  # the endpoint's own buffers are warm before the baseline
    stop = threading.Event()
    with PeakRss() as rss:
        # three at once (the case that peaked at 2.2 GB): no token, a wrong one, a hand-made huge handshake
        attackers = [
            subprocess.Popen([sys.executable, "-c", ATTACK, server.endpoint, password, "3"])
            for password in ("", "not-the-token", "")
        ]
        raw = threading.Thread(target=_raw_huge_hello, args=(host, int(port), stop), daemon=True)
        raw.start()
        try:
            for proc in attackers:
                proc.wait(timeout=60)
        finally:
            stop.set()
            for proc in attackers:
                proc.kill()
            raw.join(10)
    grown = rss.peak - rss.base
    assert grown < 8 << 20, f"the engine's process grew by {grown / 2**20:.1f} MiB under the attack"
    assert server.refused >= 1  # the wrong token was refused in the handshake, and said
    _attach_and_stream(server, bus)  # a viewer with the token still attaches and is served


def test_connections_in_their_handshake_are_capped_then_timed_out(serve) -> None:
    bus = EventBus()
    server = serve(bus, address="tcp://127.0.0.1:*", max_pending=4, handshake_s=3.0, refusals_per_s=100.0)
    host, port = server.endpoint[len("tcp://") :].rsplit(":", 1)
    clients = [socket.create_connection((host, int(port)), timeout=5) for _ in range(12)]  # they never speak

    def closed(s: socket.socket) -> bool:
        s.settimeout(0.001)
        try:
            while s.recv(4096):  # the engine's greeting, then end of stream once it hangs up
                pass
            return True
        except (TimeoutError, BlockingIOError):
            return False
        except OSError:  # reset
            return True

    started = time.monotonic()
    wait_for(lambda: sum(map(closed, clients)) >= 8, 2.0, "all but 4 silent connections to be closed")
    assert time.monotonic() - started < 3.0, "closed by the cap, not by the handshake timeout"
    assert server.gate.refused_connections == 8
    wait_for(lambda: all(map(closed, clients)), 10.0, "the last 4 to time out in their handshake")
    for s in clients:
        s.close()
    _attach_and_stream(server, bus)  # the cap is free again


def test_a_handshake_frame_over_the_frame_limit_is_hung_up_on(serve) -> None:
    server = serve(address="tcp://127.0.0.1:*", handshake_s=20.0)
    host, port = server.endpoint[len("tcp://") :].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        started = time.monotonic()
        s.sendall(_zmtp_plain_greeting() + b"\x06" + struct.pack(">Q", FRAME_BYTES + 1))
        s.settimeout(10)
        try:
            while s.recv(4096):  # the engine's greeting, then the end of the stream
                pass
        except ConnectionResetError:
            pass
    assert time.monotonic() - started < 5.0, "hung up at the frame's length, not at the handshake timeout"
