"""The bounded memory of the fold: recent events with their place in the stream, and timing samples.

A reader chooses how much the fold remembers: the dashboard a few thousand steps and a spark's worth
of timings (it stays open for days), the trace summary everything (percentiles over the whole run),
the metrics no samples at all (its histograms hear each sample as it comes, through a listener).
A ``History`` keeps each event's sequence number beside it, so the state keeper can hand a viewer the
events it retains in the order the engine published them.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Generic, Iterator, Optional, TypeVar

__all__ = ["History", "KeyedSamples", "Samples"]

E = TypeVar("E")
K = TypeVar("K")


class History(Generic[E]):
    """Events of one kind, newest last, at most ``keep`` of them (None: all)."""

    __slots__ = ("events", "seqs")

    def __init__(self, keep: Optional[int]) -> None:
        self.events: deque[E] = deque(maxlen=keep)
        self.seqs: deque[int] = deque(maxlen=keep)

    def add(self, seq: int, event: E) -> None:
        self.events.append(event)
        self.seqs.append(seq)

    def stamped(self) -> Iterator[tuple[int, E]]:
        """(sequence number, event) pairs, oldest first."""
        return zip(self.seqs, self.events)

    def __iter__(self) -> Iterator[E]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)


class Samples:
    """One timing's samples (measurements only), newest last: at most ``keep`` (None: all, 0: none
    kept), each also handed to every listener as it comes (a Prometheus histogram observes them)."""

    __slots__ = ("values", "count", "listeners")

    def __init__(self, keep: Optional[int]) -> None:
        self.values: deque[float] = deque(maxlen=keep)
        self.count = 0  # every sample ever added, kept or not
        self.listeners: list[Callable[[float], None]] = []

    def add(self, value: float) -> None:
        self.values.append(value)
        self.count += 1
        if self.listeners:
            for listener in self.listeners:
                listener(value)


class KeyedSamples(Generic[K]):
    """``Samples`` per key (a phase, a rank), made on first use; a listener hears (key, value)."""

    __slots__ = ("keep", "by_key", "_listeners")

    def __init__(self, keep: Optional[int]) -> None:
        self.keep = keep
        self.by_key: dict[K, Samples] = {}
        self._listeners: list[Callable[[K, float], None]] = []

    def listen(self, listener: Callable[[K, float], None]) -> None:
        """Hand ``listener`` every sample from now on, with its key."""
        self._listeners.append(listener)
        for key, samples in self.by_key.items():
            samples.listeners.append(_keyed(listener, key))

    def get(self, key: K) -> Samples:
        """``key``'s samples (made now if it had none): a caller may keep it and add to it directly."""
        samples = self.by_key.get(key)
        if samples is None:
            samples = self.by_key[key] = Samples(self.keep)
            samples.listeners.extend(_keyed(listener, key) for listener in self._listeners)
        return samples

    def add(self, key: K, value: float) -> None:
        self.get(key).add(value)

    def values(self, key: K) -> deque[float]:
        samples = self.by_key.get(key)
        return samples.values if samples is not None else deque()

    def all_values(self) -> list[float]:
        return [v for samples in self.by_key.values() for v in samples.values]


def _keyed(listener: Callable[[K, float], None], key: K) -> Callable[[float], None]:
    return lambda value: listener(key, value)
