"""Graph backends: capture/replay mechanics only. A backend never chooses buckets (runners do).

``capture_one`` returns the static output of the captured function; ``replay`` re-runs the graph and
returns that same tensor. All CUDA graphs of a backend share one memory pool, captured largest first,
so smaller graphs reuse the blocks the larger ones freed (``capture_order``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Optional

from ..gc_freeze import frozen_heap

if TYPE_CHECKING:  # pragma: no cover - annotations only; this module needs no torch
    from .buffers import BridgeBuffers, BufferRegistry


@dataclass(frozen=True, order=True)
class ShapeKey:
    phase: str  # decode | prefill
    size: int  # requests (decode) or tokens (prefill)
    width: int = 0  # page-table columns a fixed-width decode graph reads; 0: the one graph of its bucket


@dataclass
class ReplayTiming:
    """Filled lazily: CUDA events are read only after the step's own sync, never with an extra one."""

    read: Callable[[], tuple[Optional[float], Optional[float], Optional[float]]]


class GraphBackend(ABC):
    """Captures a function per shape key and replays it.

    A runner hands its static buffers over once (``bind``) and may ask ``live_width`` how wide replay
    metadata may be; it never needs to know which backend it has, so the composition root (the model
    runner) picks real or emulated graphs and the runners stay the same.
    """

    name: str = "abstract"
    warms_up: bool = True  # run the function eagerly before capture (JIT, autotune, workspaces)
    freeze_gc: bool = False  # capture_session freezes the GC (GraphConfig.freeze_gc: opt-in)
    registry: Optional["BufferRegistry"] = None
    bridges: Optional["BridgeBuffers"] = None

    def bind(self, registry: "BufferRegistry", bridges: Optional["BridgeBuffers"] = None) -> None:
        """The static buffers (and, for breakable graphs, the bridge buffers) every graph of this
        backend reads and writes; called once, by the runner that owns them, before any capture."""
        self.registry = registry
        self.bridges = bridges

    def live_width(self, live: int) -> Optional[int]:
        """How wide a replay's metadata (e.g. a page table) may be: None when the graph's shapes were
        fixed at capture; a backend whose replay re-runs the captured function returns ``live``."""
        return None

    @property
    def runs_at_capture(self) -> bool:
        """Whether the next ``capture_one`` runs its function (a real capture always does), so the
        caller must first put the static buffers and metadata in their capture state."""
        return True

    @property
    def executes_at_capture(self) -> bool:
        """Whether the next ``capture_one`` executes its function on the device rather than only recording
        it: such a capture is a RUN stage, which waits for nothing to be in flight (runners/capture.py). A
        CUDA capture records; what a breakable capture runs between its segments (the breaks, on the dummy
        KV page and the bridge buffers) is ordered on the device after everything already launched."""
        return False

    def capture_order(self, buckets: Iterable[int]) -> list[int]:
        """Largest first. The graphs share one memory pool: a graph captured after a larger one
        reuses the blocks the larger one's capture freed, while captured smallest first each larger
        graph needs fresh, larger blocks beside the small ones already held, and the pool grows well
        past what the largest graph alone needs (SGLang and vLLM capture largest first for the same
        reason). While the engine serves during capture this puts the small buckets, the ones a
        first request needs, last; keeping the pool small wins on a GPU, where capture takes seconds."""
        return sorted(set(buckets), reverse=True)

    @contextmanager
    def capture_session(self) -> Iterator[None]:
        """Capture with the GC frozen: every object alive now moves out of the collector's reach, so a
        collection that allocation triggers during capture walks only what the capture itself
        allocated, not the whole heap of a long-lived process, and no collection finalizes objects
        (tensors, CUDA events) in the middle of a capture.

        Opt-in (``GraphConfig.freeze_gc``): on the H200 (bench/capture_bench.py) capture with the GC
        frozen was slower than with it on, with and without a large heap, and a ``gc.collect()``
        first cost more still. Garbage alive at the freeze is merely kept until the thaw."""
        if not self.freeze_gc:
            yield
            return
        with frozen_heap():  # a heap frozen for serving stays frozen after the capture
            yield

    @abstractmethod
    def capture_one(self, key: ShapeKey, fn: Callable[[], Any]) -> Any: ...

    @abstractmethod
    def can_run(self, key: ShapeKey) -> bool: ...

    @abstractmethod
    def replay(self, key: ShapeKey) -> tuple[Any, ReplayTiming]: ...

    @abstractmethod
    def release(self, key: ShapeKey) -> None: ...

    def cleanup(self) -> None:
        for key in list(self.keys()):
            self.release(key)

    @abstractmethod
    def keys(self) -> list[ShapeKey]: ...
