"""What a viewer attached to an endpoint received of the engine's event stream, and what it lost.

Lost events are counted, never hidden: gaps in the stream's event numbers (batches the engine dropped
for this viewer), the endpoint's own queue losses since this viewer attached, and events this queue
had no room for all add up in ``dropped``, which the status line shows. ``RemoteSession``'s I/O thread
feeds frames in; the UI timer drains the events out.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Callable, Optional

import msgspec

from graphtop.engine.telemetry import protocol as p

if TYPE_CHECKING:
    from graphtop.engine.telemetry.events import Event

MAX_SEQ_JUMP = 1 << 24
"""The furthest one ``Events`` frame may move the stream's counters (``first_seq`` past the next
expected number, ``bus_dropped`` past the last count) and be believed at once. A real engine numbers
its events 0, 1, 2… and only ever counts ``bus_dropped`` up: a viewer misses at most what the engine
published while this viewer's queue was full (16 M events: half an hour at 10,000 events a second). A frame
that moves them further, or backwards, is held until the next frame says which stream is real (see
``on_events``), so one bogus frame can neither inflate ``dropped`` nor make every later event look
already seen, and a real jump of any size is still counted exactly, one frame late."""


class EventStream:
    """The decoded events waiting for the UI (bounded by ``queue_size``) and the loss counters.

    ``warn`` says a one-line warning to the user (the session's log records, shown as toasts)."""

    def __init__(self, queue_size: int, warn: Callable[[str], None]) -> None:
        self.queue_size = queue_size
        self._warn = warn
        self.events: deque[Event] = deque()
        self.expected_seq: Optional[int] = None
        self.gaps = 0
        self.local_dropped = 0
        self.undecodable = 0
        self._bus_base = 0
        self._bus_now = 0
        self._held: Optional[p.RawEvents] = None  # a frame that moved the counters implausibly far
        self._protocol_warned = False

    def welcome(self, next_seq: int, bus_dropped: int) -> None:
        """Start counting from the Welcome: the next event's number and the endpoint's losses so far."""
        self.expected_seq = next_seq
        self._bus_base = self._bus_now = bus_dropped

    @property
    def dropped(self) -> int:
        return self.gaps + (self._bus_now - self._bus_base) + self.local_dropped + self.undecodable

    def drain(self, max_items: Optional[int] = None) -> list[Event]:
        q = self.events
        n = len(q) if max_items is None else min(max_items, len(q))
        return [q.popleft() for _ in range(n)]

    def on_events(self, msg: p.RawEvents) -> None:
        """Count what the stream lost, then queue the frame's events.

        ``first_seq`` numbers events from 0 up and ``bus_dropped`` only counts up (the endpoint's
        ``StateKeeper`` and bus subscription), so a gap in the numbers is exactly what this viewer
        missed. A negative counter is a protocol error: the frame is dropped (said once). A frame
        that moves the counters backwards or further than ``MAX_SEQ_JUMP`` is held: if the next frame
        continues from it the stream really moved (a restart, a long stall) and both are taken; if the
        next one continues from before it, it was bogus and is dropped."""
        if msg.first_seq < 0 or msg.bus_dropped < 0:
            self._protocol_error(f"negative counters (first_seq {msg.first_seq}, bus_dropped {msg.bus_dropped})")
            return
        expected = self.expected_seq
        if expected is None or self._follows(msg, expected, self._bus_now):
            self._discard_held()
            self._take(msg)
            return
        held = self._held
        if held is not None and self._follows(msg, held.first_seq + len(held.events), held.bus_dropped):
            self._held = None  # the stream did move there: resynchronise on it (_take counts a gap ahead)
            if held.bus_dropped < self._bus_now:  # counted from a new base: the losses counted so far stay
                self._bus_base -= self._bus_now - held.bus_dropped
            self._take(held)
            self._take(msg)
            return
        self._discard_held()
        self._held = msg

    @staticmethod
    def _follows(msg: p.RawEvents, expected: int, bus: int) -> bool:
        """``msg`` can come after a frame that ended at ``expected`` with ``bus`` losses counted."""
        return expected <= msg.first_seq <= expected + MAX_SEQ_JUMP and bus <= msg.bus_dropped <= bus + MAX_SEQ_JUMP

    def _take(self, msg: p.RawEvents) -> None:
        """Queue a frame known to follow the stream so far, counting the numbers it skipped."""
        expected = self.expected_seq
        if expected is not None and msg.first_seq > expected:
            self.gaps += msg.first_seq - expected
        self.expected_seq = msg.first_seq + len(msg.events)
        self._bus_now = msg.bus_dropped
        self.push(msg.events)

    def _discard_held(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            self._protocol_error(
                f"an event batch numbered {held.first_seq} (expected {self.expected_seq}) with "
                f"bus_dropped {held.bus_dropped} (was {self._bus_now})"
            )

    def _protocol_error(self, what: str) -> None:
        """Say (once) that a malformed frame was dropped. Its events are not counted as lost here: if the
        real stream lost any, the next frame's number shows the gap, and ``_take`` counts it."""
        if not self._protocol_warned:
            self._protocol_warned = True
            self._warn(
                f"the engine sent a malformed frame, ignored: {what} "
                "(said once; a gap it hides shows in 'dropped' with the next frame)"
            )

    def push(self, pairs: list[tuple[str, msgspec.Raw]]) -> None:
        """Decode and queue events (a snapshot's, or a frame's once counted); what has no room is counted."""
        if not pairs:
            return
        events, bad = p.decode_events(pairs)
        self.undecodable += bad
        room = self.queue_size - len(self.events)
        if len(events) > room:
            self.local_dropped += len(events) - max(room, 0)
            events = events[: max(room, 0)]
        self.events.extend(events)
