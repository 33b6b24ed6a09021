"""Worker processes that compile kernel variants into Triton's on-disk cache while the engine serves.

Why processes: Triton's compile holds the GIL through its Python front end, so a compile on a thread
still stalls the step thread; a worker process compiles for an explicit target and never touches the
GPU (no CUDA context, no device memory). Workers are plain subprocesses (``compile_worker``), started on
the first variant that is not on disk, so a start whose cache is warm spawns none.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import subprocess
import sys
import threading
from concurrent.futures import Future, wait
from dataclasses import asdict, dataclass, field
from typing import Iterable, Optional

from . import precompile
from .precompile import KernelVariant

__all__ = ["CompileStats", "KernelCompiler", "default_workers", "shared_compiler"]

WORKER_MODULE = "graphtop.models.kernels.compile_worker"
WAIT_S = 600.0  # the longest ``wait`` blocks; a cold compile of one variant takes seconds


def default_workers() -> int:
    """A worker per core, less two (the step thread and the rest of the host), at most eight."""
    return max(1, min(8, (os.cpu_count() or 2) - 2))


@dataclass
class CompileStats:
    """What the compiler has done (``KernelCompiler.stats``): variants asked for, found on disk, compiled
    by a worker, failed, and the compile seconds the workers spent (summed over workers, so more than the
    wall time)."""

    requested: int = 0
    on_disk: int = 0
    compiled: int = 0
    failed: int = 0
    worker_seconds: float = 0.0
    failures: list[str] = field(default_factory=list)


Job = Optional[tuple[KernelVariant, "Future[float]"]]


class KernelCompiler:
    """Compiles each variant once, in worker processes; ``done`` says whether a set of variants is ready
    to launch without compiling (on disk, or failed: the launch then reports the failure itself)."""

    def __init__(self, workers: Optional[int] = None) -> None:
        self.workers = workers or default_workers()
        self._futures: dict[str, Future[float]] = {}
        self._origin: dict[str, str] = {}  # key -> "disk" | "compiled" | "failed", once known
        self._worker_seconds = 0.0
        self._failures: list[str] = []
        self._jobs: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._procs: list[subprocess.Popen[str]] = []
        self._closed = False
        self._lock = threading.Lock()
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
                future: Future[float] = Future()
                self._futures[key] = future
                if _on_disk(variant):
                    self._origin[key] = "disk"
                    future.set_result(0.0)
                    continue
                self._start_workers()
            future.add_done_callback(lambda f, label=variant.label, key=key: self._record(f, label, key))
            self._jobs.put((variant, future))
        return keys

    @property
    def stats(self) -> CompileStats:
        """The counts so far, from each variant's origin."""
        with self._lock:
            counts = _tally(self._origin.values())
            return CompileStats(
                len(self._futures),
                counts["disk"],
                counts["compiled"],
                counts["failed"],
                self._worker_seconds,
                list(self._failures),
            )

    def done(self, keys: Iterable[str]) -> bool:
        return all(self._futures[k].done() for k in keys)

    def wait(self, keys: Iterable[str], timeout: Optional[float] = WAIT_S) -> bool:
        """Block until the variants are done, at most ``timeout`` seconds (a stuck worker must not hang
        an engine that captures before serving: its capture then compiles what is missing). True if done."""
        _, pending = wait([self._futures[k] for k in keys], timeout=timeout)
        return not pending

    def close(self) -> None:
        """Stop the workers; variants still queued are cancelled (they compile on their first launch)."""
        if self._hook is not None:
            precompile.leave(self._hook)
            self._hook = None
        with self._lock:
            self._closed = True
            procs, self._procs = self._procs, []
        for future in list(self._futures.values()):
            future.cancel()
        for _ in self._threads:
            self._jobs.put(None)
        for proc in procs:
            proc.kill()
            proc.wait()

    def _in_flight(self, key: str) -> Optional[Future[float]]:
        with self._lock:
            return self._futures.get(key)

    def _start_workers(self) -> None:
        """Start the workers once (under the lock), each with a thread that feeds it jobs."""
        if self._threads or self._closed:
            return
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), CUDA_VISIBLE_DEVICES="")
        for i in range(self.workers):
            proc = subprocess.Popen(
                [sys.executable, "-m", WORKER_MODULE],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                env=env,
            )
            self._procs.append(proc)
            thread = threading.Thread(target=self._feed, args=(proc,), name=f"kernel-compile-{i}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def _feed(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        while (job := self._jobs.get()) is not None:
            variant, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                proc.stdin.write(json.dumps(asdict(variant)) + "\n")
                proc.stdin.flush()
                answer = json.loads(proc.stdout.readline() or '{"error": "the compile worker exited"}')
            except (OSError, ValueError) as e:
                answer = {"error": f"the compile worker failed: {e}"}
            if "error" in answer:
                future.set_exception(RuntimeError(answer["error"]))
            else:
                future.set_result(float(answer["seconds"]))

    def origins(self, keys: Iterable[str]) -> dict[str, int]:
        """How many of ``keys`` were found on disk, compiled by a worker, or failed to compile."""
        with self._lock:
            return _tally(self._origin.get(key) for key in set(keys))

    def _record(self, future: Future[float], label: str, key: str) -> None:
        with self._lock:
            if future.cancelled():
                return
            error = future.exception()
            self._origin[key] = "compiled" if error is None else "failed"
            if error is None:
                self._worker_seconds += future.result()
            else:
                self._failures.append(f"{label}: {str(error)[:200]}")


def _tally(origins: Iterable[Optional[str]]) -> dict[str, int]:
    """Origins counted by kind (an unknown one, a compile still running, is left out)."""
    counts = {"disk": 0, "compiled": 0, "failed": 0}
    for origin in origins:
        if origin is not None:
            counts[origin] += 1
    return counts


def _on_disk(variant: KernelVariant) -> bool:
    """``precompile.is_cached``, False where the cache key cannot be computed (the worker then reports why)."""
    try:
        return precompile.is_cached(variant)
    except Exception:
        return False


_shared: Optional[KernelCompiler] = None
_shared_lock = threading.Lock()


def shared_compiler() -> KernelCompiler:
    """The process's compiler: its workers outlive an engine, so the next engine in the same process (a
    benchmark's, a test suite's) reuses them instead of starting its own, and each variant is compiled
    once a process. Idle workers wait on their input; they stop when the process exits (or dies: their
    input closes)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = KernelCompiler()
            atexit.register(_shared.close)
        return _shared
