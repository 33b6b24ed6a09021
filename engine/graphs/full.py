"""Full CUDA graphs: one ``torch.cuda.CUDAGraph`` per shape key, all in one shared pool."""

from __future__ import annotations

from typing import Any, Callable

import torch

from .backend import ReplayTiming, ShapeKey
from .cuda_pool import CudaGraphPoolBackend


class FullCudaGraphBackend(CudaGraphPoolBackend):
    name = "full"

    def __init__(self, device: torch.device):
        super().__init__(device)
        self._events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))

    def capture_one(self, key: ShapeKey, fn: Callable[[], Any]) -> Any:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            out = fn()
        self.graphs[key] = (graph, out)
        return out

    def replay(self, key: ShapeKey) -> tuple[Any, ReplayTiming]:
        graph, out = self.graphs[key]
        start, end = self._events
        start.record()
        graph.replay()
        end.record()
        return out, ReplayTiming(lambda: (start.elapsed_time(end), None, None))
