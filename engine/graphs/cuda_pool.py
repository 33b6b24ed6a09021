"""What the full and breakable CUDA backends share: graphs keyed by shape, one memory pool for all.

Captured largest first into the one pool, smaller graphs reuse blocks the larger ones freed; replays
never overlap, so sharing is safe. ``cleanup`` drops every graph and starts a fresh pool, whose old
blocks return to the allocator once no graph holds them.
"""

from __future__ import annotations

from typing import Any

import torch

from .backend import GraphBackend, ShapeKey

CAPTURE_MODE = "thread_local"
"""Stream capture forbids the capturing thread's unsafe CUDA calls only: the step thread serves meanwhile."""


class CudaGraphPoolBackend(GraphBackend):
    def __init__(self, device: torch.device):
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device)
        self.graphs: dict[ShapeKey, Any] = {}

    def can_run(self, key: ShapeKey) -> bool:
        return key in self.graphs

    def release(self, key: ShapeKey) -> None:
        self.graphs.pop(key, None)

    def cleanup(self) -> None:
        super().cleanup()
        self.pool = torch.cuda.graph_pool_handle()
        torch.cuda.empty_cache()

    def keys(self) -> list[ShapeKey]:
        return list(self.graphs)
