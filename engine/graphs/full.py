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
        # A ring of event pairs: with the overlap schedule step N is read back after step N+1 was
        # launched, so N+1 must not re-record the events N's timing still reads.
        self._events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(3)]
        self._next_events = 0

    def capture_one(self, key: ShapeKey, fn: Callable[[], Any]) -> Any:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            out = fn()
        self.graphs[key] = (graph, out)
        return out

    def replay(self, key: ShapeKey) -> tuple[Any, ReplayTiming]:
        graph, out = self.graphs[key]
        start, end = self._events[self._next_events]
        self._next_events = (self._next_events + 1) % len(self._events)
        start.record()
        graph.replay()
        end.record()
        return out, ReplayTiming(lambda: (start.elapsed_time(end), None, None))
