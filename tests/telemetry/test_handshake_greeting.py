"""A viewer reaching an endpoint of another mechanism is told so whichever side notices the mismatch first:
the endpoint's greeting is read when ZeroMQ reports only a handshake failure with no detail."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest
import zmq

from graphtop.engine.telemetry import wire
from graphtop.engine.telemetry.gate import Gate, GateConfig
from graphtop.engine.telemetry.greeting import announced_mechanism, client_greeting


def _router(address: str, gated: bool) -> tuple[zmq.Context, zmq.Socket]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    if gated:
        Gate(ctx, GateConfig(token="t")).secure(sock)
    sock.bind(address)
    return ctx, sock


@pytest.mark.parametrize("gated, want", [(False, "NULL"), (True, "PLAIN")], ids=["protocol-1", "gated"])
@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_the_announced_mechanism_is_read_from_the_greeting(tmp_path: Path, gated, want, transport) -> None:
    address = f"ipc://{tmp_path}/e.sock" if transport == "ipc" else "tcp://127.0.0.1:*"
    ctx, sock = _router(address, gated)
    try:
        endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        assert announced_mechanism(endpoint) == want
    finally:
        sock.close(0)
        ctx.term()


def test_nothing_listening_or_another_transport_reads_as_unknown(tmp_path: Path) -> None:
    assert announced_mechanism(f"ipc://{tmp_path}/absent.sock") is None
    assert announced_mechanism("inproc://x") is None and announced_mechanism("tcp://host-without-port") is None


class _LosesTheRace:
    """A ZMTP endpoint of the NULL mechanism that always notices the mismatch first: it shuts a ZeroMQ
    client's connection with the client's mechanism unread, before sending its own (the viewer then sees a
    failure with no detail, every time); a greeting probe, which sends no mechanism, gets the whole greeting."""

    def __init__(self, path: str) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(8)
        self.listener.settimeout(0.1)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except socket.timeout:
                continue
            ours = client_greeting(b"NULL")
            with conn:
                conn.settimeout(0.5)
                try:
                    conn.recv(10)  # the signature
                    conn.sendall(ours[:10])
                    conn.recv(1)  # the major version
                    conn.sendall(ours[10:11])
                    time.sleep(0.05)  # a ZeroMQ client now sends the rest of its greeting
                    conn.settimeout(0)
                    try:
                        more = conn.recv(1, socket.MSG_PEEK)
                    except BlockingIOError:
                        more = b""
                    conn.settimeout(0.5)
                    if not more:  # the probe: no mechanism follows
                        conn.sendall(ours[11:])
                    # else shut with the client's mechanism unread: its write fails, with no detail
                except OSError:
                    pass

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.listener.close()


def test_a_mismatch_reported_with_no_detail_is_named_from_the_greeting(tmp_path: Path) -> None:
    path = f"{tmp_path}/e.sock"
    server = _LosesTheRace(path)
    ctx = zmq.Context()
    sock = wire.viewer_socket(ctx, "t", "v")
    watch = wire.HandshakeWatch(sock, f"ipc://{path}")
    try:
        sock.connect(f"ipc://{path}")
        deadline = time.monotonic() + 10
        reason = None
        while reason is None and time.monotonic() < deadline:
            reason = watch.failure()
            time.sleep(0.02)
        assert reason == wire.OTHER_MECHANISM
    finally:
        watch.close()
        sock.close(0)
        ctx.term()
        server.close()
