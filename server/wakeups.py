"""Wake-ups from the engine's thread into the server's event loop, one for all of a step's tokens.

The engine delivers a step's tokens to every stream in one burst, on its own thread. Each
``loop.call_soon_threadsafe`` writes to the loop's self-pipe (a system call on the engine's thread) and is
a callback on the loop: with a stream a request, that is a wake-up per stream per step. A ``LoopWaker``
gathers the readers a burst wakes and asks the loop for one call that wakes them all, so a step costs the
engine one self-pipe write however many streams it feeds.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from typing import Callable

_wakers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopWaker]" = weakref.WeakKeyDictionary()
_wakers_lock = threading.Lock()


class LoopWaker:
    """Runs callbacks on ``loop`` soon, asked from any thread, with one pending loop call at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._pending: list[Callable[[], None]] = []
        self._scheduled = False

    def wake(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the loop soon (any thread); nothing once the loop is closed."""
        with self._lock:
            self._pending.append(callback)
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._flush)
        except RuntimeError:  # the loop is closed: the server is gone, and so are the readers
            with self._lock:
                self._pending.clear()
                self._scheduled = False

    def _flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
            self._scheduled = False
        for callback in pending:
            callback()


def waker_for(loop: asyncio.AbstractEventLoop) -> LoopWaker:
    """The loop's waker (one per loop, made on first use)."""
    with _wakers_lock:
        waker = _wakers.get(loop)
        if waker is None:
            waker = _wakers[loop] = LoopWaker(loop)
        return waker
