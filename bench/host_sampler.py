"""Where one thread's host time goes, sampled from inside the process: a stack every millisecond.

Why: a step whose host time is long (a capture slice before it, a kernel loaded, a wait on the device) is
rare, and cProfile over a whole run hides it among thousands of short ones. This samples the stepping
thread's Python stack at a fixed interval (``sys._current_frames``) and weighs each sample by the time since
the one before it, so a C call that holds the GIL (the sampler cannot run meanwhile) is charged to the stack
found right after it, for as long as it held it. ``between(t0, t1)`` then says where a given window went.
The sampler takes the GIL for a few tens of microseconds a sample: figures taken with it are for finding
causes, not for reporting step times.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

SKIP = ("/threading.py", "/contextlib.py", "/torch/nn/modules/module.py", "/torch/utils/_contextlib.py")
"""Frames that only pass calls on: left out of a sample's stack."""


def _frame_name(code_file: str, name: str, line: int) -> str:
    parts = code_file.replace("\\", "/").split("/")
    short = "/".join(parts[-2:])
    return f"{short}:{line}({name})"


@dataclass
class HostSampler:
    """Samples ``thread_id``'s stack every ``interval_s``; ``depth`` innermost frames a sample."""

    thread_id: int
    interval_s: float = 0.001
    depth: int = 8
    samples: list[tuple[float, float, tuple[str, ...]]] = field(default_factory=list)
    """(wall time of the sample, seconds it stands for, innermost frames first)."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: Optional[threading.Thread] = None

    def start(self) -> "HostSampler":
        self._thread = threading.Thread(target=self._run, name="host-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        last = time.time()
        while not self._stop.wait(self.interval_s):
            frame = sys._current_frames().get(self.thread_id)
            now = time.time()
            if frame is None:
                last = now
                continue
            stack: list[str] = []
            while frame is not None and len(stack) < self.depth:
                code = frame.f_code
                if not code.co_filename.endswith(SKIP):
                    stack.append(_frame_name(code.co_filename, code.co_name, frame.f_lineno))
                frame = frame.f_back
            self.samples.append((now, now - last, tuple(stack)))
            last = now

    def between(self, t0: float, t1: float, top: int = 4) -> list[tuple[float, tuple[str, ...]]]:
        """The ``top`` stacks by time (ms) over the samples in [t0, t1] (wall time)."""
        weights: Counter[tuple[str, ...]] = Counter()
        for ts, seconds, stack in self.samples:
            if t0 <= ts <= t1 + self.interval_s:
                weights[stack] += seconds * 1e3
        return [(ms, stack) for stack, ms in weights.most_common(top)]


def explain(sampler: HostSampler, t0: float, t1: float, top: int = 4, frames: int = 6) -> list[str]:
    """Lines saying where the window [t0, t1] went: per stack its ms and its innermost ``frames``."""
    lines = []
    for ms, stack in sampler.between(t0, t1, top):
        lines.append(f"    {ms:7.1f} ms  " + " < ".join(stack[:frames]))
    return lines
