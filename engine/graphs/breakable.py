"""Breakable (segmented) CUDA graphs: segments end at attention, which runs eagerly in between.

``eager_on_graph`` marks a function as a break. While a breakable capture is active, calling it
1. copies its tensor inputs into *bridge* buffers (the copy is the last op of the current segment),
2. ends the segment, runs the function eagerly once and writes its result into the bridge output,
3. records a replay closure and begins the next segment, which reads the bridge output.

At replay, segment replays alternate with the break closures; each closure calls the function
again, so it reads the *live* batch's metadata (FlashInfer plan, request lengths), never
capture-time values.

Why explicit bridges instead of weak references to captured intermediates (SGLang's approach): pure
torch has no non-owning tensor, and strong references to every layer's q/k/v would pin pool memory
per bucket. Bridges are allocated once at max size outside the pool and shared by all buckets and
layers, so every address a segment touches is either in the shared pool (freed between captures,
reused by the next bucket, which never replays concurrently) or in a static buffer.
"""

from __future__ import annotations

import contextvars
import functools
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from .backend import ReplayTiming, ShapeKey
from .buffers import BridgeBuffers
from .cuda_pool import CAPTURE_MODE, CudaGraphPoolBackend

_capture: contextvars.ContextVar[Optional["_BreakSite"]] = contextvars.ContextVar("graphtop_break", default=None)


def eager_on_graph(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Mark ``fn(*tensors, *scalars) -> tensor`` as an eager break inside breakable graphs."""

    @functools.wraps(fn)
    def wrapper(*args: Any) -> torch.Tensor:
        site = _capture.get()
        if site is None:
            return fn(*args)
        return site.on_break(fn, args)

    return wrapper


class _BreakSite:
    """The per-capture (or per-emulated-run) state that ``eager_on_graph`` talks to."""

    def __init__(self, bridges: BridgeBuffers):
        self.bridges = bridges
        self.breaks: list[Callable[[], None]] = []

    def stage(self, args: tuple[Any, ...]) -> tuple[tuple[Any, ...], torch.Tensor]:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if len(tensors) > len(self.bridges.inputs):
            raise RuntimeError("break function has more tensor inputs than bridge buffers")
        staged: list[Any] = []
        ti = 0
        for a in args:
            if isinstance(a, torch.Tensor):
                view = self.bridges.inputs[ti][: a.shape[0]].view(a.shape)
                view.copy_(a)
                staged.append(view)
                ti += 1
            else:
                staged.append(a)
        n = tensors[0].shape[0]
        return tuple(staged), self.bridges.output[:n]

    def on_break(self, fn: Callable[..., torch.Tensor], args: tuple[Any, ...]) -> torch.Tensor:
        raise NotImplementedError


class _CudaBreakSite(_BreakSite):
    def __init__(self, bridges: BridgeBuffers, pool: Any, stream: torch.cuda.Stream):
        super().__init__(bridges)
        self.pool = pool
        self.stream = stream
        self.segments: list[torch.cuda.CUDAGraph] = []
        self._current: Optional[torch.cuda.CUDAGraph] = None

    def begin_segment(self) -> None:
        g = torch.cuda.CUDAGraph()
        g.capture_begin(pool=self.pool, capture_error_mode=CAPTURE_MODE)
        self._current = g

    def end_segment(self) -> None:
        assert self._current is not None
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*empty.*")  # back-to-back breaks: no-op graph
            self._current.capture_end()
        self.segments.append(self._current)
        self._current = None

    def on_break(self, fn: Callable[..., torch.Tensor], args: tuple[Any, ...]) -> torch.Tensor:
        staged, out = self.stage(args)
        out_view = out.view(args[0].shape)
        self.end_segment()

        def replay_fn() -> None:
            out_view.copy_(fn(*staged))

        replay_fn()
        self.breaks.append(replay_fn)
        self.begin_segment()
        return out_view


@dataclass
class BreakableGraph:
    segments: list[torch.cuda.CUDAGraph]
    breaks: list[Callable[[], None]]
    output: Any
    events: list[torch.cuda.Event] = field(default_factory=list)

    def replay(self) -> None:
        ev = self.events
        ev[0].record()
        for i, seg in enumerate(self.segments):
            seg.replay()
            ev[2 * i + 1].record()
            if i < len(self.breaks):
                self.breaks[i]()
                ev[2 * i + 2].record()

    def timings(self) -> tuple[float, float, float]:
        ev = self.events
        seg_ms = brk_ms = 0.0
        for i in range(len(ev) - 1):
            dt = ev[i].elapsed_time(ev[i + 1])
            if i % 2 == 0:
                seg_ms += dt
            else:
                brk_ms += dt
        return seg_ms + brk_ms, seg_ms, brk_ms


class BreakableCudaGraphBackend(CudaGraphPoolBackend):
    name = "breakable"

    def capture_one(self, key: ShapeKey, fn: Callable[[], Any]) -> Any:
        assert self.bridges is not None, "bind() the bridge buffers before capturing"
        site = _CudaBreakSite(self.bridges, self.pool, self.stream)
        self.stream.wait_stream(torch.cuda.current_stream())
        token = _capture.set(site)
        try:
            with torch.cuda.stream(self.stream):
                site.begin_segment()
                out = fn()
                site.end_segment()
        finally:
            _capture.reset(token)
        torch.cuda.current_stream().wait_stream(self.stream)
        n_events = len(site.segments) + len(site.breaks) + 1
        events = [torch.cuda.Event(enable_timing=True) for _ in range(n_events)]
        self.graphs[key] = BreakableGraph(site.segments, site.breaks, out, events)
        return out

    def replay(self, key: ShapeKey) -> tuple[Any, ReplayTiming]:
        g = self.graphs[key]
        g.replay()
        return g.output, ReplayTiming(g.timings)


class _EmulatedBreakSite(_BreakSite):
    """Runs breaks through the same bridge buffers as the CUDA path, timing segments vs breaks."""

    def __init__(self, bridges: BridgeBuffers):
        super().__init__(bridges)
        self.break_s = 0.0
        self.num_breaks = 0

    def on_break(self, fn: Callable[..., torch.Tensor], args: tuple[Any, ...]) -> torch.Tensor:
        t0 = time.perf_counter()
        staged, out = self.stage(args)
        result = fn(*staged)
        out_view = out.view(result.shape)
        out_view.copy_(result)
        self.break_s += time.perf_counter() - t0
        self.num_breaks += 1
        return out_view


def emulated_break_site(bridges: Optional[BridgeBuffers]) -> Optional[_EmulatedBreakSite]:
    return _EmulatedBreakSite(bridges) if bridges is not None else None


def run_with_break_site(site: Optional[_BreakSite], fn: Callable[[], Any]) -> Any:
    if site is None:
        return fn()
    token = _capture.set(site)
    try:
        return fn()
    finally:
        _capture.reset(token)
