"""Which graph backend a phase gets: the one place that knows real CUDA graphs from emulated ones.

Decode replays whole graphs ("full"); prefill replays segments around eager attention ("breakable").
Without CUDA graphs both are emulated: the same runners, buckets, padding and fallbacks, on CPU.
"""

from __future__ import annotations

import torch

from .backend import GraphBackend
from .emulated import EmulatedGraphBackend

KINDS = ("full", "breakable")


def graph_backend(kind: str, device: torch.device, *, emulated: bool, freeze_gc: bool = False) -> GraphBackend:
    """A fresh backend of ``kind`` for ``device``; ``freeze_gc`` captures with the GC frozen
    (``GraphConfig.freeze_gc``)."""
    if kind not in KINDS:
        raise ValueError(f"unknown graph backend {kind!r}; choose {' or '.join(KINDS)}")
    backend: GraphBackend
    if emulated:
        backend = EmulatedGraphBackend(kind)
    elif kind == "full":
        from .full import FullCudaGraphBackend

        backend = FullCudaGraphBackend(device)
    else:
        from .breakable import BreakableCudaGraphBackend

        backend = BreakableCudaGraphBackend(device)
    backend.freeze_gc = freeze_gc
    return backend
