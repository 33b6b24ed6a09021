"""One thread at a time inside the step loop's state (scheduler, KV pool, graphs, requests).

A step, a close and a failed step's clean-up each hold the guard. A second thread that steps (two
threads streaming without the background thread) waits its turn; a close from another thread waits
for the step in flight instead of freeing the pool under it. The thread that holds the guard can only
re-enter it through a callback it runs (``RequestHandle.on_update``): a step inside a step would see
half-built state, and waiting there for the engine would wait on itself, so that is refused.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator, Optional

from ..errors import EngineError


class StepGuard:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: Optional[int] = None  # the thread that holds the lock

    def inside(self) -> bool:
        """The calling thread holds the guard: it is inside a step (or a close), in a callback."""
        return self._owner == threading.get_ident()

    def refuse_inside(self, what: str) -> None:
        if self.inside():
            raise EngineError(
                f"{what} cannot be called from inside a step (an on_update callback runs there); "
                "submit() and cancel() can, and close() closes once the step is over"
            )

    @contextmanager
    def hold(self, what: str) -> Iterator[None]:
        self.refuse_inside(what)
        with self._lock:
            self._owner = threading.get_ident()
            try:
                yield
            finally:
                self._owner = None
