"""Emulated graphs for CPU (and anywhere CUDA graphs are unavailable).

It runs the same runners, buckets, padding and fallback logic as the CUDA backends, and checks the
contract a real graph depends on: at capture it records every static buffer's address, and every
replay asserts that no address moved and that the output is the static output buffer. Replay re-runs
the captured function on the static buffers; breakable functions still go through the bridge
buffers, timed as breaks.

Capture records the contract rather than doing the work: a real capture records kernels, but an
emulated replay re-runs the function anyway, so running it at every bucket proves nothing the first
replay does not, and costs a full forward per bucket (seconds for a 2,048-token prefill bucket on a
CPU). The first capture after ``cleanup`` runs the function once (it must run, and it shows where the
static output lives); every capture records the static buffers' addresses.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Optional

from .backend import GraphBackend, ReplayTiming, ShapeKey
from .breakable import emulated_break_site, run_with_break_site
from .buffers import StaticBufferError


class EmulatedGraphBackend(GraphBackend):
    warms_up = False  # nothing is compiled or tuned: a replay is the eager function

    def __init__(self, label: str = "full"):
        self.name = f"emulated-{label}"
        self.fns: dict[ShapeKey, Callable[[], Any]] = {}
        self.addresses: dict[ShapeKey, dict[str, int]] = {}
        # Where the static output lives: every graph of a runner returns a view from the start of
        # the runner's one output buffer (``logits_out[:bs]``, ``hidden_out[:n]``), as on CUDA.
        self.output: Optional[int] = None

    def live_width(self, live: int) -> Optional[int]:
        return live  # a replay re-runs the function: its metadata may follow the live batch

    @property
    def runs_at_capture(self) -> bool:
        return self.output is None

    @property
    def executes_at_capture(self) -> bool:
        return self.output is None  # the first capture after cleanup runs the function: a RUN stage

    def capture_order(self, buckets: Iterable[int]) -> list[int]:
        """Smallest first: no memory pool to share, and the small buckets are the ones the first
        requests need while the engine serves during capture."""
        return sorted(set(buckets))

    def capture_one(self, key: ShapeKey, fn: Callable[[], Any]) -> Any:
        """Record ``key``'s contract; the first capture after ``cleanup`` also runs ``fn`` and returns
        its output (later ones return None: nothing ran)."""
        out = None
        if self.output is None:
            out = run_with_break_site(emulated_break_site(self.bridges), fn)
            self.output = _ptr(out)
        self.fns[key] = fn
        self.addresses[key] = self._snapshot()
        return out

    def _snapshot(self) -> dict[str, int]:
        assert self.registry is not None, "bind() the static buffers before capturing"
        snap = self.registry.addresses()
        if self.bridges is not None:
            for i, t in enumerate(self.bridges.inputs):
                snap[f"bridge_in_{i}"] = t.data_ptr()
            snap["bridge_out"] = self.bridges.output.data_ptr()
        return snap

    def can_run(self, key: ShapeKey) -> bool:
        return key in self.fns

    def replay(self, key: ShapeKey) -> tuple[Any, ReplayTiming]:
        now = self._snapshot()
        for name, ptr in self.addresses[key].items():
            if now.get(name) != ptr:
                raise StaticBufferError(f"static buffer {name!r} moved since capture of {key}")
        site = emulated_break_site(self.bridges)
        t0 = time.perf_counter()
        out = run_with_break_site(site, self.fns[key])
        total_ms = (time.perf_counter() - t0) * 1e3
        if _ptr(out) != self.output:
            raise StaticBufferError(f"output of {key} is not the static output buffer captured")
        if site is None:
            return out, ReplayTiming(lambda: (total_ms, None, None))
        brk = site.break_s * 1e3
        return out, ReplayTiming(lambda: (total_ms, total_ms - brk, brk))

    def release(self, key: ShapeKey) -> None:
        self.fns.pop(key, None)
        self.addresses.pop(key, None)
        if not self.fns:
            self.output = None

    def keys(self) -> list[ShapeKey]:
        return list(self.fns)


def _ptr(out: Any) -> Optional[int]:
    return out.data_ptr() if hasattr(out, "data_ptr") else None
