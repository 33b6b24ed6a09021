"""The telemetry endpoint's gate: who may send the engine anything, and how many may try at once.

Why (``wire`` says more): ZeroMQ buffers a whole multipart message before the endpoint can look at it,
so a token read from the first message came too late. The gate checks the token in ZeroMQ's handshake
instead, as the ZAP handler of the endpoint's own context (``inproc://zeromq.zap.01``): a peer whose PLAIN
password is not the token is refused there, and ZeroMQ never hands the endpoint a message of its. Until
then a peer can make ZeroMQ read at most one frame of ``wire.FRAME_BYTES``, and only for
``handshake_s`` (ZeroMQ's ``HANDSHAKE_IVL``).

That bounds one connection. Their number is bounded here too, without letting anyone lock viewers out:
the socket's monitor reports each accepted connection with its file descriptor, and the connections in
their handshake are kept in a :class:`~.handshakes.PendingHandshakes` table of ``max_pending`` (see there
for who gives way when it is full: per-address fairness, then the oldest past ``patience_s``). A
connection it gives up is shut at once (``shutdown(2)`` on a duplicate of its descriptor, after
checking that the descriptor is still a connection to this endpoint: ZeroMQ then closes it as if the
peer had). A connection stops counting when the endpoint reads its first message (``passed``: the
viewer's ``Hello``, which it sends once ZeroMQ says its handshake succeeded), when it closes, or after
``handshake_s`` (by then ZeroMQ has dropped it unless it authenticated). A shut viewer reconnects on its
own (ZeroMQ retries after 100 to 200 ms) and says ``Hello`` again after its next handshake.

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

from .handshakes import PendingHandshakes
from .wire import FRAME_BYTES, ZAP_DOMAIN

ZAP_ENDPOINT = "inproc://zeromq.zap.01"


@dataclass(frozen=True)
class GateConfig:
    token: str
    max_pending: int = 32
    handshake_s: float = 5.0
    patience_s: float = 1.0


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
        self.pending = PendingHandshakes(config.max_pending, config.handshake_s, config.patience_s)
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
        """``answer`` then ``follow``: for an endpoint that reads its messages elsewhere."""
        return self.answer() + self.follow()

    def answer(self) -> list[str]:
        """Answer waiting handshakes; returns what was refused, one line each."""
        return self._answer_handshakes()

    def follow(self, read_at: Optional[float] = None) -> list[str]:
        """Follow accepted and closed connections, shutting what ``max_pending`` leaves no room for;
        returns what was refused, one line each. Call it after reading the endpoint's messages: a
        ``Hello`` read first frees its connection's place instead of it being shut. ``read_at``: when the
        endpoint last read every message waiting (see ``PendingHandshakes.accepted``)."""
        return self._follow_connections(read_at) if self.monitor is not None else []

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

    # -- connections in their handshake ---------------------------------------------------------------
    def _peer(self, fd: int) -> str:
        """The address the connection on ``fd`` comes from: its host ("" for a Unix socket, or when it
        cannot be told: such connections share one fair share)."""
        if isinstance(self._local, str):
            return ""
        seen = _connection(fd, self._local)
        return seen[1] if seen is not None else ""

    def passed(self, fd: int) -> None:
        """The endpoint read the first message of the connection on ``fd`` (``zmq.SRCFD``): it holds the
        token, and no longer counts against ``max_pending``."""
        inode = _inode(fd)
        if inode is not None:  # else closed since: nothing to count
            self.pending.passed((fd, inode), time.monotonic())

    def _follow_connections(self, read_at: Optional[float], limit: int = 64) -> list[str]:
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
                self.pending.closed(fd, _inode(fd))
            if event["event"] != zmq.EVENT_ACCEPTED:
                continue
            inode = _inode(fd)  # the one system call per connection while there is room
            if inode is None:  # closed before this event was read
                continue
            victim = self.pending.accepted((fd, inode), time.monotonic(), self._peer, read_at)
            if victim is not None and self.pending.may_shut(victim) and _shut(victim, self._local):
                self.refused_connections += 1
                which = "a new one" if victim[0] == fd else "the one waiting longest"
                refused.append(f"{self.config.max_pending} connections were in their handshake: closed {which}")
        return refused


def _local_address(endpoint: str) -> object:
    """What ``getsockname`` gives for a connection accepted on ``endpoint``: the socket path (ipc), or
    the port (tcp: the host part is the interface the peer reached, which a wildcard bind does not name)."""
    if endpoint.startswith("ipc://"):
        return endpoint[len("ipc://") :]
    return int(endpoint.rsplit(":", 1)[1])


def _inode(fd: int) -> Optional[int]:
    """The inode of the socket on ``fd`` (which connection the number means now), None once closed."""
    try:
        return os.fstat(fd).st_ino
    except OSError:
        return None


def _connection(fd: int, local: object) -> Optional[tuple[int, str]]:
    """(inode, peer) of the connection on ``fd`` when it is one accepted on this endpoint (the number
    could have been closed and reused since the monitor's event): the peer is the address it comes
    from, its host ("" for a Unix socket)."""
    try:
        dup = os.dup(fd)
    except OSError:
        return None
    try:
        conn = socket.socket(fileno=dup)
    except OSError:  # not a socket (any more)
        os.close(dup)
        return None
    with conn:  # closes the duplicate only
        try:
            peer = conn.getpeername()  # the listening socket has no peer
            here = conn.getsockname()
            if conn.family == socket.AF_UNIX:
                return (os.fstat(dup).st_ino, "") if here == local else None
            return (os.fstat(dup).st_ino, str(peer[0])) if here[1] == local else None
        except (OSError, IndexError, TypeError):
            return None


def _shut(conn: tuple[int, int], local: object) -> bool:
    """Shut ``conn`` (descriptor, inode) when its descriptor still holds that socket and it is a
    connection accepted on this endpoint; ZeroMQ sees the peer gone and closes it."""
    fd, inode = conn
    try:
        dup = os.dup(fd)
    except OSError:
        return False
    try:
        sock = socket.socket(fileno=dup)
    except OSError:  # not a socket (any more)
        os.close(dup)
        return False
    with sock:  # closes the duplicate only
        try:
            sock.getpeername()  # the listening socket has no peer
            here = sock.getsockname()
            ours = here == local if sock.family == socket.AF_UNIX else here[1] == local
            if not ours or os.fstat(dup).st_ino != inode:  # closed, and the number reused since
                return False
            sock.shutdown(socket.SHUT_RDWR)
        except (OSError, IndexError, TypeError):
            return False
        return True
