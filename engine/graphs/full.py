"""Full CUDA graphs: one ``torch.cuda.CUDAGraph`` per shape key, all in one shared pool.

A capture begins and ends the graph itself instead of entering ``torch.cuda.graph``, which first
synchronizes the device and empties the caching allocator's and the pinned host cache: on the capture
thread that would wait for the step thread's work and hand the memory its eager steps reuse back to the
driver, to be allocated again (synchronously) by the next step. Capture is thread-local
(``cudaStreamCaptureModeThreadLocal``), so the step thread's CUDA calls stay legal while it runs.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch

from .backend import ReplayTiming, ShapeKey
from .cuda_pool import CAPTURE_MODE, CudaGraphPoolBackend


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
        with torch.cuda.stream(self.stream):
            graph.capture_begin(pool=self.pool, capture_error_mode=CAPTURE_MODE)
            try:
                out = fn()
            except BaseException:
                with contextlib.suppress(Exception):  # the capture's own error, not the ending's
                    graph.capture_end()
                raise
            graph.capture_end()
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
