"""Freezing the garbage collector's view of the heap, nested: a freeze inside a frozen heap leaves the
outer one in place. Used while the engine serves (the CLI, the dashboard) and, opt-in, around graph
capture (``GraphConfig.freeze_gc``, graphs/backend.py).

Why serve frozen: once a model is loaded the process holds a few hundred thousand long-lived objects (torch, the
tokenizer, the engine, the imported modules). A full (oldest-generation) collection walks all of them
and stops every thread meanwhile: about 170 ms on the 2-core CPU for 341,670 objects, a step's worth
of stall that lands at random in a long run. Frozen (``gc.freeze``, as vLLM's engine core does after
start-up), they are skipped, and a collection walks only what serving allocated since. The freeze is
undone when serving ends (the dashboard: when its session shuts down), so a program that runs the CLI
in-process (the tests) keeps collecting what it allocated before.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

__all__ = ["freeze_heap", "frozen_heap", "thaw_heap"]


def freeze_heap() -> bool:
    """Freeze everything alive now. Returns whether this call is the one to thaw it (nothing was frozen)."""
    first = gc.get_freeze_count() == 0
    gc.freeze()
    return first


def thaw_heap(first: bool) -> None:
    """Undo ``freeze_heap`` if it was the first freeze (an outer one stays)."""
    if first:
        gc.unfreeze()


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Freeze everything alive now for the block; thaw after it unless it was frozen already."""
    first = freeze_heap()
    try:
        yield
    finally:
        thaw_heap(first)
