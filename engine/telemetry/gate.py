"""The telemetry endpoint's gate: who may send the engine anything, and how many may try at once.

Why (``wire`` says more): ZeroMQ buffers a whole multipart message before the endpoint can look at it,
so a token read from the first message came too late. The gate checks the token in ZeroMQ's handshake
instead, as the ZAP handler of the endpoint's own context (``inproc://zeromq.zap.01``): a peer whose PLAIN
password is not the token is refused there, and ZeroMQ never hands the endpoint a message of its. Until
then a peer can make ZeroMQ read at most one frame of ``wire.FRAME_BYTES``, and only for
``handshake_s`` (ZeroMQ's ``HANDSHAKE_IVL``).

That bounds one connection. Their number is bounded here too: the socket's monitor reports each accepted
connection with its file descriptor; when ``max_pending`` connections accepted in the last ``handshake_s``
seconds are still open, a new one is shut at once (``shutdown(2)`` on a duplicate of its descriptor,
after checking that the descriptor is still a connection to this endpoint: ZeroMQ then closes it as if
the peer had). A connection counts from its accept until it closes or ``handshake_s`` has passed (by
then ZeroMQ has dropped it unless it authenticated), so a burst of real viewers counts too; a refused
one reconnects (ZeroMQ retries every 100 ms) and gets in once the burst is over. While a flood goes on,
new viewers wait with it; viewers already attached are not touched.

Everything here runs on the endpoint's publisher thread, which polls ``sockets``.
"""

from __future__ import annotations

import hmac
import os
import socket
import time
from dataclasses import dataclass
from typing import Optional

import zmq

from .wire import FRAME_BYTES, ZAP_DOMAIN

ZAP_ENDPOINT = "inproc://zeromq.zap.01"


@dataclass(frozen=True)
class GateConfig:
    token: str
    max_pending: int = 32
    handshake_s: float = 5.0


class Gate:
    """The ZAP handler and the connection cap of one endpoint socket; see the module docstring."""

    def __init__(self, ctx: zmq.Context, config: GateConfig) -> None:
        self.config = config
        self._token = config.token.encode()
        self.zap = ctx.socket(zmq.REP)  # bound before the endpoint listens: no handshake goes unanswered
        self.zap.setsockopt(zmq.LINGER, 0)
        self.zap.bind(ZAP_ENDPOINT)
        self._ctx = ctx
        self.monitor: Optional[zmq.Socket] = None
        self._sock: Optional[zmq.Socket] = None
        self._local: object = None  # the listening address an accepted connection of ours has
        self._pending: dict[int, float] = {}  # fd -> when it was accepted
        self.refused_connections = 0

    @property
    def sockets(self) -> list[zmq.Socket]:
        return [s for s in (self.zap, self.monitor) if s is not None]

    def secure(self, sock: zmq.Socket) -> None:
        """Before ``bind``: the handshake checks the token, frames are capped, handshakes are timed."""
        sock.setsockopt(zmq.PLAIN_SERVER, 1)
        sock.setsockopt_string(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
        sock.setsockopt(zmq.MAXMSGSIZE, FRAME_BYTES)
        sock.setsockopt(zmq.HANDSHAKE_IVL, max(1, int(self.config.handshake_s * 1000)))

    def watch(self, sock: zmq.Socket, endpoint: str) -> None:
        """After ``bind``: follow the socket's connections (accepted, closed) to cap the pending ones."""
        self._sock = sock
        self._local = _local_address(endpoint)
        address = f"inproc://graphtop-gate-{id(self):x}"
        sock.monitor(address, zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        self.monitor = self._ctx.socket(zmq.PAIR)
        self.monitor.setsockopt(zmq.RCVHWM, 100_000)  # ZeroMQ's I/O thread blocks on a full monitor queue
        self.monitor.setsockopt(zmq.LINGER, 0)
        self.monitor.connect(address)

    def serve(self) -> list[str]:
        """Answer waiting handshakes and follow connections; returns what was refused, one line each."""
        refused = self._answer_handshakes()
        if self.monitor is not None:
            refused += self._follow_connections()
        return refused

    def close(self) -> None:
        if self._sock is not None and self.monitor is not None:
            self._sock.disable_monitor()
            self.monitor.close(0)
            self.monitor = None
        self.zap.close(0)

    # -- ZAP ------------------------------------------------------------------------------------------
    def _answer_handshakes(self, limit: int = 64) -> list[str]:
        refused: list[str] = []
        for _ in range(limit):
            try:
                request = self.zap.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            # version, request id, domain, address, routing id, mechanism, credentials (PLAIN: user, password);
            # every request is answered (a REP socket takes no request before it answered the last)
            fields = request + [b""] * (6 - len(request))  # a short request (never ZeroMQ's) is refused too
            request_id, address, mechanism, creds = fields[1], fields[3], fields[5], fields[6:]
            ok = mechanism == b"PLAIN" and len(creds) == 2 and hmac.compare_digest(creds[1], self._token)
            self.zap.send_multipart(
                [b"1.0", request_id, b"200" if ok else b"400", b"OK" if ok else b"wrong token", b"", b""]
            )
            if not ok:
                who = address.decode("ascii", "replace") or "a local client"
                refused.append(f"wrong token in the handshake of a client at {who}")
        return refused

    # -- the connection cap -----------------------------------------------------------------------------
    def _follow_connections(self, limit: int = 1024) -> list[str]:
        from zmq.utils.monitor import recv_monitor_message

        assert self.monitor is not None
        refused: list[str] = []
        for _ in range(limit):
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                break
            fd = event["value"]
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self._pending.pop(fd, None)
            if event["event"] != zmq.EVENT_ACCEPTED:
                continue
            now = time.monotonic()
            horizon = now - self.config.handshake_s
            for old in [f for f, at in self._pending.items() if at < horizon]:
                del self._pending[old]  # authenticated by now, or dropped by ZeroMQ
            if len(self._pending) < self.config.max_pending:
                self._pending[fd] = now
            elif _shut(fd, self._local):
                self.refused_connections += 1
                refused.append(
                    f"{self.config.max_pending} connections are already in their handshake: closed a new one"
                )
        return refused


def _local_address(endpoint: str) -> object:
    """What ``getsockname`` gives for a connection accepted on ``endpoint``: the socket path (ipc), or
    the port (tcp: the host part is the interface the peer reached, which a wildcard bind does not name)."""
    if endpoint.startswith("ipc://"):
        return endpoint[len("ipc://") :]
    return int(endpoint.rsplit(":", 1)[1])


def _shut(fd: int, local: object) -> bool:
    """Shut the connection on ``fd`` when it is still one accepted on this endpoint (the number could
    have been reused since the event); ZeroMQ sees the peer gone and closes it."""
    try:
        dup = os.dup(fd)
    except OSError:
        return False
    try:
        conn = socket.socket(fileno=dup)
    except OSError:  # not a socket (any more)
        os.close(dup)
        return False
    with conn:  # closes the duplicate only
        try:
            conn.getpeername()  # the listening socket has no peer
            here = conn.getsockname()
            ours = here == local if conn.family == socket.AF_UNIX else here[1] == local
            if ours:
                conn.shutdown(socket.SHUT_RDWR)
            return ours
        except (OSError, IndexError, TypeError):
            return False
