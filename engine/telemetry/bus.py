"""In-process fan-out of engine events to the dashboard, the recorder and the logs.

The engine publishes from its hot loop, so ``publish`` is built to be as cheap as a few deque
appends: it never takes a lock, never waits for a consumer and never touches a device. A consumer
that falls behind loses events (counted in ``Subscription.dropped``) instead of stalling the engine.

Drop policy: **drop-newest**. When a subscription's queue is full the incoming event is discarded and
the queue keeps what it already holds. This keeps ``dropped`` exact (only the producer ever decides
to drop) and means a consumer never sees an event vanish from under it; the price is that a badly
lagging dashboard shows slightly stale data until it catches up, which is preferable to an engine
that slows down because nobody is watching.

Threading model: one producer (the engine thread) and one consumer per subscription. ``deque``
append/popleft are atomic in CPython, so the queue itself needs no lock. Several publishing threads
are safe too, but then the ``dropped``/``accepted`` counters may be off by a few.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from typing import Any, Callable, Iterable, Optional

from ..arguments import wait_timeout
from .events import EVENT_TYPES, ErrorEvent, Event, StepEvent

__all__ = ["EventBus", "Subscription", "LoggingSubscriber", "BusInUse"]


class BusInUse(ValueError):
    """An EventBus given to a second engine while the first still publishes on it."""


class Subscription:
    """A bounded, non-blocking queue of events for one consumer.

    Created by ``EventBus.subscribe``; the consumer calls ``drain`` (polling, e.g. a dashboard
    timer) or ``get`` (blocking, e.g. the recorder thread).
    """

    def __init__(self, name: str, maxsize: int, types: Optional[frozenset[str]]) -> None:
        if maxsize < 1:
            raise ValueError(f"subscription {name!r}: maxsize must be >= 1, got {maxsize}")
        self.name = name
        self.maxsize = maxsize
        self.types = types
        self.dropped = 0  # events discarded because the queue was full (producer-side counter)
        self.accepted = 0  # events queued (producer-side counter)
        self._queue: deque[Event] = deque()
        self._wakeup = threading.Event()
        self._waiting = False  # set by a consumer blocked in get(); only then does publish signal
        self._closed = False

    # -- producer side (engine thread) ------------------------------------------------------------

    def _offer(self, event: Event) -> None:
        """Queue ``event`` or count it as dropped; never blocks."""
        if self.types is not None and event.type not in self.types:
            return
        if len(self._queue) >= self.maxsize:
            self.dropped += 1
            return
        self._queue.append(event)
        self.accepted += 1
        if self._waiting:  # cheap flag check; Event.set only when a consumer actually sleeps
            self._wakeup.set()

    # -- consumer side ----------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Events queued and not yet consumed."""
        return len(self._queue)

    @property
    def closed(self) -> bool:
        return self._closed

    def drain(self, max_items: Optional[int] = None) -> list[Event]:
        """Return up to ``max_items`` queued events (all if None), oldest first; never blocks."""
        out: list[Event] = []
        popleft = self._queue.popleft
        limit = len(self._queue) if max_items is None else max_items
        try:
            for _ in range(limit):
                out.append(popleft())
        except IndexError:
            pass
        return out

    def get(self, timeout: Optional[float] = None) -> Optional[Event]:
        """Return the next event, waiting up to ``timeout`` seconds (forever if None or ``inf``; NaN is a
        ValueError, see ``engine/arguments.py``).

        Returns None on timeout or once the subscription is closed and empty. The wait happens on
        the consumer side only; the publisher never waits for it.
        """
        timeout = wait_timeout(timeout, "Subscription.get")
        try:
            return self._queue.popleft()
        except IndexError:
            pass
        if timeout is not None and timeout <= 0:
            return None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._closed:
                return self._pop_or_none()
            self._wakeup.clear()
            self._waiting = True
            # Re-check after announcing we wait: an append that raced with clear() is seen here.
            item = self._pop_or_none()
            if item is not None:
                self._waiting = False
                return item
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                self._waiting = False
                return None
            self._wakeup.wait(remaining)
            self._waiting = False
            item = self._pop_or_none()
            if item is not None:
                return item

    def close(self) -> None:
        """Stop accepting events and wake a consumer blocked in ``get``; queued events stay drainable."""
        self._closed = True
        self._wakeup.set()

    def _pop_or_none(self) -> Optional[Event]:
        try:
            return self._queue.popleft()
        except IndexError:
            return None

    def __repr__(self) -> str:
        return (
            f"Subscription(name={self.name!r}, pending={self.pending}, dropped={self.dropped}, "
            f"types={sorted(self.types) if self.types is not None else None})"
        )


class EventBus:
    """Fan-out of events to subscriptions. ``publish`` is lock-free and O(subscribers).

    The subscriber list is an immutable tuple replaced on (un)subscribe (copy-on-write under a
    lock), so the hot path reads it without locking and a bus with zero subscribers costs one
    attribute load and a truth test per publish.
    """

    def __init__(self) -> None:
        self._subs: tuple[Subscription, ...] = ()
        self._lock = threading.Lock()
        self._publisher: Optional[tuple[weakref.ref[Any], Callable[[Any], bool]]] = None

    def check_unclaimed(self) -> None:
        """Raise ``BusInUse`` while a publisher that claimed this bus is alive and still publishing.

        Why: events carry no publisher identity, and two engines both number their requests req-0,
        req-1, …: on one bus, one engine's finished req-0 removed the other's live req-0 from every viewer's
        picture. One bus, one engine (a closed or collected one hands the bus on)."""
        if self._publisher is None:
            return
        ref, publishing = self._publisher
        owner = ref()
        if owner is not None and publishing(owner):
            raise BusInUse(
                "this EventBus already carries the events of another engine that is still open: give "
                "each engine its own bus (events name no engine, and both number requests req-0, "
                "req-1, …), or close the other engine first"
            )

    def claim(self, owner: Any, publishing: Callable[[Any], bool]) -> None:
        """Make ``owner`` this bus's publisher while ``publishing(owner)`` holds (weakly: a collected owner
        frees the bus)."""
        with self._lock:
            self.check_unclaimed()
            self._publisher = (weakref.ref(owner), publishing)

    @property
    def has_subscribers(self) -> bool:
        """False lets the engine skip even building events it would publish."""
        return bool(self._subs)

    @property
    def subscriptions(self) -> tuple[Subscription, ...]:
        """Current subscriptions (e.g. for a dashboard panel showing drop counts)."""
        return self._subs

    def publish(self, event: Event) -> None:
        """Offer ``event`` to every subscription. Never blocks, never raises for a full queue."""
        subs = self._subs
        if not subs:
            return
        for sub in subs:
            sub._offer(event)

    def subscribe(self, name: str, maxsize: int = 10000, types: Optional[Iterable[str]] = None) -> Subscription:
        """Add a subscription receiving events whose ``type`` is in ``types`` (all if None)."""
        type_set: Optional[frozenset[str]] = None
        if types is not None:
            type_set = frozenset(types)
            unknown = sorted(type_set - EVENT_TYPES.keys())
            if unknown:
                raise ValueError(f"subscription {name!r}: unknown event types {unknown}")
        sub = Subscription(name, maxsize, type_set)
        with self._lock:
            self._subs = self._subs + (sub,)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        """Remove ``sub`` (idempotent) and close it so a blocked ``get`` returns."""
        with self._lock:
            self._subs = tuple(s for s in self._subs if s is not sub)
        sub.close()


class LoggingSubscriber:
    """Logs every event through ``logging`` from its own daemon thread.

    Steps go to DEBUG (they are many), error events to WARNING/ERROR (fatal), everything else to
    INFO. If the logger is not enabled for DEBUG when ``start`` is called, step events are not even
    subscribed to, so the engine pays nothing for them; pass ``include_steps`` to force either way.
    """

    def __init__(
        self,
        bus: EventBus,
        logger: Optional[logging.Logger] = None,
        name: str = "log",
        maxsize: int = 10000,
        include_steps: Optional[bool] = None,
    ) -> None:
        self.bus = bus
        self.logger = logger or logging.getLogger("graphtop.events")
        self.name = name
        self.maxsize = maxsize
        self.include_steps = include_steps
        self.subscription: Optional[Subscription] = None
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "LoggingSubscriber":
        steps = self.include_steps
        if steps is None:
            steps = self.logger.isEnabledFor(logging.DEBUG)
        types = None if steps else set(EVENT_TYPES) - {StepEvent.type}
        self.subscription = self.bus.subscribe(self.name, self.maxsize, types)
        self._thread = threading.Thread(target=self._run, name=f"graphtop-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Unsubscribe, log what is still queued, and join the thread."""
        if self.subscription is None:
            return
        self.bus.unsubscribe(self.subscription)
        if self._thread is not None:
            self._thread.join(timeout)
        if self.subscription.dropped:
            self.logger.warning(
                "event log subscriber %r dropped %d events (queue full)",
                self.name,
                self.subscription.dropped,
            )

    def _run(self) -> None:
        sub = self.subscription
        assert sub is not None
        while True:
            event = sub.get(timeout=0.5)
            if event is None:
                if sub.closed and sub.pending == 0:
                    return
                continue
            self._log(event)

    def _log(self, event: Event) -> None:
        if isinstance(event, StepEvent):
            level = logging.DEBUG
        elif isinstance(event, ErrorEvent):
            level = logging.ERROR if event.fatal else logging.WARNING
        else:
            level = logging.INFO
        if self.logger.isEnabledFor(level):
            fields = {k: v for k, v in event.to_dict().items() if k not in ("type", "ts")}
            self.logger.log(level, "%s %s", event.type, fields)
