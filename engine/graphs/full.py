"""Full CUDA graphs: one ``torch.cuda.CUDAGraph`` per shape key, all in one shared pool."""

from __future__ import annotations

from typing import Any, Callable

import torch

from .backend import GraphBackend, ReplayTiming, ShapeKey


class FullCudaGraphBackend(GraphBackend):
    name = "full"

    def __init__(self, device: torch.device):
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device)
        self.graphs: dict[ShapeKey, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[ShapeKey, Any] = {}
        self._events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))

    def capture_one(self, key: ShapeKey, fn: Callable[[], Any]) -> Any:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            out = fn()
        self.graphs[key] = graph
        self.outputs[key] = out
        return out

    def can_run(self, key: ShapeKey) -> bool:
        return key in self.graphs

    def replay(self, key: ShapeKey) -> tuple[Any, ReplayTiming]:
        start, end = self._events
        start.record()
        self.graphs[key].replay()
        end.record()
        return self.outputs[key], ReplayTiming(lambda: (start.elapsed_time(end), None, None))

    def release(self, key: ShapeKey) -> None:
        self.graphs.pop(key, None)
        self.outputs.pop(key, None)

    def cleanup(self) -> None:
        super().cleanup()
        # A fresh pool: the old one's blocks go back to the allocator once no graph holds them.
        self.pool = torch.cuda.graph_pool_handle()
        torch.cuda.empty_cache()

    def keys(self) -> list[ShapeKey]:
        return list(self.graphs)
