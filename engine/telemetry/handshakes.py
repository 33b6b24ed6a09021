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

PASSED_MEMORY_S = 30.0
"""How long a passed connection is remembered, at least (``handshake_s`` when longer). The monitor's
events can lag a burst by seconds, and the inode is read when an event is read, not when it happened: an
old connection's accept event read after its number went to a viewer that already passed names that
viewer's connection, as does that connection's own accept event later. Both must find it passed, or the
viewer would be counted again and shut once the table is full."""


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
    _passed: dict[Connection, float] = field(default_factory=dict)  # first message read, and when

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
        if conn in self._passed:
            return None  # its first message was read before this accept event (its own, or a stale one)
        fd, inode = conn
        entry = self._pending.get(fd)
        if entry is not None and entry.inode == inode:
            return None  # counted already: a stale accept event for its descriptor number
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
        """The first message of ``conn`` was read: its handshake is over, and it never counts again."""
        fd, inode = conn
        entry = self._pending.get(fd)
        if entry is not None and entry.inode == inode:
            del self._pending[fd]
        self._passed[conn] = now

    def may_shut(self, conn: Connection) -> bool:
        """False when ``conn`` has passed: never shut an attached viewer."""
        return conn not in self._passed

    def closed(self, fd: int, inode_now: Optional[int] = None) -> None:
        """The monitor says a connection on ``fd`` closed. ``inode_now``: the inode of the socket on ``fd``
        now (None: closed, or not known): when it is the pending entry's, that connection is still open
        and the event was about an earlier one with the same number."""
        entry = self._pending.get(fd)
        if entry is not None and (inode_now is None or entry.inode != inode_now):
            del self._pending[fd]

    def _oldest(self, peers: set[str]) -> int:
        return min((fd for fd, e in self._pending.items() if e.peer in peers), key=lambda fd: self._pending[fd].since)

    def _expire(self, now: float) -> None:
        horizon = now - self.handshake_s
        for fd in [fd for fd, e in self._pending.items() if e.since < horizon]:
            del self._pending[fd]  # passed by now (its first message not read yet), or dropped by ZeroMQ
        memory = now - max(self.handshake_s, PASSED_MEMORY_S)
        for conn in [conn for conn, at in self._passed.items() if at < memory]:
            del self._passed[conn]
