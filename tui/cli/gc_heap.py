"""The loaded heap, out of the garbage collector's reach while the engine serves.

Why: once a model is loaded the process holds a few hundred thousand long-lived objects (torch, the
tokenizer, the engine, the imported modules). A full (oldest-generation) collection walks all of them
and stops every thread meanwhile: about 170 ms on the 2-core CPU for 341,670 objects, a step's worth
of stall that lands at random in a long run. Frozen (``gc.freeze``, as vLLM's engine core does after
start-up), they are skipped, and a collection walks only what serving allocated since. The freeze is
undone when serving ends, so a program that runs the CLI in-process (the tests) keeps collecting what
it allocated before.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

__all__ = ["frozen_heap"]


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Freeze everything alive now for the block; thaw after it unless it was frozen already."""
    outer = gc.get_freeze_count() > 0
    gc.freeze()
    try:
        yield
    finally:
        if not outer:
            gc.unfreeze()
