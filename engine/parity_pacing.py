"""Pacing a parity re-run: one layer of its eager forward per device wait of the step loop.

Why: the re-run is mostly Python (an eager forward launches every kernel one by one) and shares the
GIL with the step loop, whose own host work sits on the critical path of a small decode step. Each
time the step loop re-takes the GIL (every torch call releases it) it may wait for the worker. So
the worker starts a layer only at the beginning of one of the step loop's device waits (reading a
step's tokens back), one layer per wait: that layer's Python then runs while the step loop has
nothing to do, and has usually finished before the step loop wakes up. A check spans about as many
steps as the model has layers. With no new wait within ``PACE_WAIT_S`` (an idle engine, or one that
samples on the host) the layer goes ahead anyway.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

PACE_WAIT_S = 0.002
"""Longest a paced re-run waits before a layer for a new device wait of the step loop."""


class DeviceWaits:
    """The step loop's device waits, numbered; a paced worker takes one layer per wait."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled  # off: the worker never waits (and the step loop opens no waits)
        self._cond = threading.Condition()
        self._open = False
        self._number = 0
        self._taken = 0  # the last wait a layer ran in

    def during(self, wait: Callable[[], Any]) -> Any:
        """Step loop: run ``wait`` (blocking on the device) as a new wait; returns what it returns."""
        with self._cond:
            self._number += 1
            self._open = True
            self._cond.notify_all()
        try:
            return wait()
        finally:
            self._open = False

    def next_layer(self, timeout: float) -> bool:
        """Worker: block until a wait no layer has run in yet is open (or ``timeout``); True if one is."""
        if not self.enabled:
            return False
        with self._cond:
            found = self._cond.wait_for(lambda: self._open and self._number != self._taken, timeout)
            self._taken = self._number
            return bool(found)


class Paced:
    """What the model's ``before_layer`` calls while checks are on: the registered worker threads
    pace themselves; any other thread's forward passes straight through. Engines sharing one model
    each register their own worker."""

    _workers: dict[int, DeviceWaits] = {}

    @classmethod
    def register(cls, ident: int, waits: DeviceWaits) -> None:
        cls._workers[ident] = waits

    @classmethod
    def unregister(cls, ident: Optional[int]) -> None:
        cls._workers.pop(ident, None)  # type: ignore[arg-type]

    @classmethod
    def registered(cls) -> dict[int, DeviceWaits]:
        return dict(cls._workers)

    @staticmethod
    def before_layer() -> None:
        waits = Paced._workers.get(threading.get_ident())
        if waits is not None:
            waits.next_layer(PACE_WAIT_S)
