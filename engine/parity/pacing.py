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
    """Puts the model's ``before_layer`` hook on and takes it off: while a checker uses a model, the
    hook paces that checker's worker thread, and any other thread's forward passes straight through.
    Engines sharing one model each register their own worker; the hook leaves the model with the
    last of them."""

    _workers: dict[int, tuple[DeviceWaits, Any]] = {}  # worker thread ident -> (its waits, the decoder)

    @classmethod
    def attach(cls, decoder: Any, ident: int, waits: DeviceWaits) -> None:
        """Pace thread ``ident`` through ``waits`` in ``decoder``'s forwards (a decoder without the
        hook, another architecture, is left alone)."""
        if hasattr(decoder, "before_layer"):
            cls._workers[ident] = (waits, decoder)
            decoder.before_layer = cls.before_layer

    @classmethod
    def detach(cls, ident: Optional[int]) -> None:
        entry = cls._workers.pop(ident, None)  # type: ignore[arg-type]
        if entry is not None and not any(d is entry[1] for _, d in cls._workers.values()):
            entry[1].before_layer = None

    @classmethod
    def registered(cls) -> dict[int, DeviceWaits]:
        return {ident: waits for ident, (waits, _) in cls._workers.items()}

    @staticmethod
    def before_layer() -> None:
        entry = Paced._workers.get(threading.get_ident())
        if entry is not None:
            entry[0].next_layer(PACE_WAIT_S)
