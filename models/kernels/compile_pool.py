"""Worker processes that compile kernel variants into Triton's on-disk cache while the engine serves.

Why processes: Triton's compile holds the GIL through its Python front end, so a compile on a thread
still stalls the step thread; a worker process compiles for an explicit target and never touches the
GPU (no CUDA context, no device memory). Workers start on the first variant that is not on disk, so a
start whose cache is warm spawns none.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Iterable, Optional

from . import precompile
from .precompile import KernelVariant

__all__ = ["CompileStats", "KernelCompiler", "default_workers"]


def default_workers() -> int:
    """A worker per core, less two (the step thread and the rest of the host), at most eight."""
    return max(1, min(8, (os.cpu_count() or 2) - 2))


@dataclass
class CompileStats:
    """What the compiler has done: variants asked for, found on disk, compiled here, failed, and the
    compile seconds the workers spent (summed over workers, so more than the wall time)."""

    requested: int = 0
    on_disk: int = 0
    compiled: int = 0
    failed: int = 0
    worker_seconds: float = 0.0
    failures: list[str] = field(default_factory=list)


class KernelCompiler:
    """Compiles each variant once, in worker processes; ``done`` says whether a set of variants is ready
    to launch without compiling (on disk, or failed: the launch then reports the failure itself)."""

    def __init__(self, workers: Optional[int] = None) -> None:
        self.workers = workers or default_workers()
        self.stats = CompileStats()
        self._futures: dict[str, Future[float]] = {}
        self._pool: Optional[ProcessPoolExecutor] = None
        self._lock = threading.Lock()
        self._started = time.perf_counter()
        self._hook = precompile.join_in_flight(self._in_flight) if precompile.supported() else None

    def submit(self, variants: Iterable[KernelVariant]) -> list[str]:
        """Queue the variants not yet asked for; returns the keys of all of them (for ``done``/``wait``)."""
        keys = []
        for variant in variants:
            key = variant.key
            keys.append(key)
            with self._lock:
                if key in self._futures:
                    continue
                self.stats.requested += 1
                if precompile.is_cached(variant):
                    self.stats.on_disk += 1
                    self._futures[key] = _finished(0.0)
                    continue
                future = self._executor().submit(precompile.compile_variant, variant)
                future.add_done_callback(lambda f, label=variant.label: self._record(f, label))
                self._futures[key] = future
        return keys

    def done(self, keys: Iterable[str]) -> bool:
        return all(self._futures[k].done() for k in keys)

    def wait(self, keys: Iterable[str]) -> None:
        wait([self._futures[k] for k in keys])

    @property
    def busy(self) -> bool:
        """Variants are still compiling."""
        return not all(f.done() for f in list(self._futures.values()))

    def _in_flight(self, key: str) -> Optional[Future[float]]:
        with self._lock:
            return self._futures.get(key)

    def close(self) -> None:
        """Stop the workers; compiles not started are dropped (their variants compile on first launch)."""
        if self._hook is not None:
            precompile.leave(self._hook)
            self._hook = None
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:  # spawned: a forked child would inherit the CUDA context and the engine's threads
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
        return self._pool

    def _record(self, future: Future[float], label: str) -> None:
        with self._lock:
            if future.cancelled():
                return
            error = future.exception()
            if error is None:
                self.stats.compiled += 1
                self.stats.worker_seconds += future.result()
            else:
                self.stats.failed += 1
                self.stats.failures.append(f"{label}: {type(error).__name__}: {str(error).splitlines()[0][:160]}")


def _finished(value: float) -> Future[float]:
    future: Future[float] = Future()
    future.set_result(value)
    return future
