"""Clean-up that finishes even when a caller's callback interrupts it.

Failing a step's requests and closing the engine finish handles, and finishing a handle runs its
``on_update`` callback. KeyboardInterrupt and SystemExit from a callback go through to the caller by
design (``RequestHandle._notify``: a Ctrl-C must stop the program), but raised part-way through a
clean-up they would leave every request after that one unfinished: its KV pages held, its waiters
blocked for ever, a close that can never be repeated. So each part of a clean-up runs under
``deferred()``: the first exception is kept, the rest of the clean-up runs, and ``reraise()`` raises it
once everything is finished and released.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional


class DeferredInterrupts:
    def __init__(self) -> None:
        self.first: Optional[BaseException] = None

    @contextmanager
    def deferred(self) -> Iterator[None]:
        try:
            yield
        except BaseException as e:  # noqa: BLE001 - kept, and raised by reraise() after the clean-up
            if self.first is None:
                self.first = e

    def reraise(self) -> None:
        first, self.first = self.first, None
        if first is not None:
            raise first
