"""Graph backends: capture/replay mechanics only. A backend never chooses buckets (runners do).

``capture_one`` returns the static output of the captured function; ``replay`` re-runs the graph and
returns that same tensor. All graphs of a backend share one memory pool, captured largest first, so
smaller graphs reuse the blocks the larger ones freed.
"""

from __future__ import annotations

import gc
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional


@dataclass(frozen=True, order=True)
class ShapeKey:
    phase: str  # decode | prefill
    size: int  # requests (decode) or tokens (prefill)


@dataclass
class ReplayTiming:
    """Filled lazily: CUDA events are read only after the step's own sync, never with an extra one."""

    read: Callable[[], tuple[Optional[float], Optional[float], Optional[float]]]


class GraphBackend(ABC):
    name: str = "abstract"
    emulated: bool = False

    @contextmanager
    def capture_session(self) -> Iterator[None]:
        """Capture with the GC frozen, so no collection runs (and frees pool tensors) mid-capture."""
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            gc.unfreeze()

    @abstractmethod
    def capture_one(self, key: ShapeKey, fn: Callable[[], Any]) -> Any: ...

    @abstractmethod
    def can_run(self, key: ShapeKey) -> bool: ...

    @contextmanager
    def replay_session(self) -> Iterator[None]:
        yield

    @abstractmethod
    def replay(self, key: ShapeKey) -> tuple[Any, ReplayTiming]: ...

    @abstractmethod
    def release(self, key: ShapeKey) -> None: ...

    def cleanup(self) -> None:
        for key in list(self.keys()):
            self.release(key)

    @abstractmethod
    def keys(self) -> list[ShapeKey]: ...
