"""Which connections in their handshake the telemetry endpoint keeps when too many come at once.

Why a policy and not a plain cap: each connection in its handshake may make ZeroMQ hold one frame of
``wire.FRAME_BYTES`` before anyone knows whether it holds the token, so their number is bounded
(``limit``). A cap that shuts every newcomer once it is full lets 32 connections that send 5 bytes and
wait lock every viewer out for as long as they wait, and a cap that counts a connection until its
handshake timeout even once it has passed lets a crowd of real viewers lock each other out. So:

- a connection stops counting as soon as it has passed: its first message (the viewer's ``Hello``,
  sent once ZeroMQ says the handshake succeeded) is read (``passed``), or it closes (``closed``), or
  ``handshake_s`` is over (ZeroMQ has dropped it by then unless it passed);
- when a newcomer finds the table full, an address that holds more entries than the newcomer's gives
  up its oldest one (per-peer fairness: a flood from one address cannot keep another address out);
- else the newcomer competes with the entries of the addresses holding the most: the oldest of them
  gives way once it has waited ``patience_s`` (a real handshake takes milliseconds, a round trip or
  three over a network), otherwise the newcomer is shut and reconnects (ZeroMQ retries after 100 to
  200 ms, jittered, and the viewer says ``Hello`` again after the next handshake).

Pure bookkeeping: the ``gate`` feeds it the socket monitor's events and shuts what it returns.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Optional

Connection = tuple[int, int]
"""(file descriptor, inode of its socket): the descriptor's number is reused once a connection closes,
and the monitor's events and the messages read can be behind or ahead of each other; the inode tells
which connection a number means now."""


@dataclass
class _Entry:
    inode: int
    since: float
    peer: Optional[str] = None  # looked up only when the table is full (a system call per connection)


@dataclass
class PendingHandshakes:
    """Connections accepted and not yet passed, closed or timed out, by descriptor."""

    limit: int = 32
    handshake_s: float = 5.0
    patience_s: float = 1.0
    _pending: dict[int, _Entry] = field(default_factory=dict)
    _early: dict[Connection, float] = field(default_factory=dict)  # passed before its accept was seen

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ValueError(f"the limit of connections in their handshake must be >= 1, got {self.limit}")

    def __len__(self) -> int:
        return len(self._pending)

    def accepted(
        self, conn: Connection, now: float, peer_of: Callable[[int], str], read_at: Optional[float] = None
    ) -> Optional[Connection]:
        """Count ``conn``; returns the connection to shut to stay within ``limit`` (an older entry, now
        forgotten, or ``conn`` itself, not counted), or None. ``peer_of(fd)`` says the address a
        connection comes from (asked only when the table is full). ``read_at``: when the endpoint last
        read every message waiting (``now`` if not given): an entry gives way only once it had waited
        ``patience_s`` by then, so an endpoint slow to read (its thread waiting for the GIL) does not shut
        viewers whose ``Hello`` it has not got to."""
        read_at = now if read_at is None else read_at
        self._expire(now)
        if self._early.pop(conn, None) is not None:
            return None  # its first message was read before the monitor said it was accepted
        fd, inode = conn
        if len(self._pending) < self.limit:
            self._pending[fd] = _Entry(inode, now)
            return None
        for other, entry in self._pending.items():
            if entry.peer is None:
                entry.peer = peer_of(other)
        peer = peer_of(fd)
        held = Counter(entry.peer for entry in self._pending.values())
        most = max(held.values())
        hogs = {p for p, n in held.items() if n == most}
        if held[peer] + 1 < most:  # an address holds more than the newcomer's would: it gives way
            victim = self._oldest(hogs)
        else:  # the newcomer's address is among those holding the most: the oldest of them, if it waited
            victim = self._oldest(hogs | {peer})
            if read_at - self._pending[victim].since < self.patience_s:
                return conn
        gone = self._pending.pop(victim)
        self._pending[fd] = _Entry(inode, now, peer)
        return victim, gone.inode

    def passed(self, conn: Connection, now: float) -> None:
        """The first message of ``conn`` was read: its handshake is over."""
        fd, inode = conn
        entry = self._pending.get(fd)
        if entry is not None and entry.inode == inode:
            del self._pending[fd]
        else:
            self._early[conn] = now

    def may_shut(self, conn: Connection) -> bool:
        """False when ``conn`` has passed (its first message was read before the monitor said it was
        accepted): never shut an attached viewer."""
        return conn not in self._early

    def closed(self, fd: int) -> None:
        """The monitor says the connection on ``fd`` closed (the one its last accept event named)."""
        self._pending.pop(fd, None)

    def _oldest(self, peers: set[str]) -> int:
        return min((fd for fd, e in self._pending.items() if e.peer in peers), key=lambda fd: self._pending[fd].since)

    def _expire(self, now: float) -> None:
        horizon = now - self.handshake_s
        for fd in [fd for fd, e in self._pending.items() if e.since < horizon]:
            del self._pending[fd]  # passed by now (its first message not read yet), or dropped by ZeroMQ
        for conn in [conn for conn, at in self._early.items() if at < horizon]:
            del self._early[conn]
