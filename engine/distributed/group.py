"""Rank 0's side of a tensor-parallel group: spawns the worker ranks, feeds them, hears them, buries them.

Processes (nano-vllm's and mini-sglang's model): rank 0 is the engine's own process; ranks 1..N-1 are
spawned with torch.multiprocessing's spawn context (fresh interpreters: no forked CUDA state), and
all join one torch.distributed group. Rank 0 talks to each worker over a one-way pipe: one message
per call that runs the model (wire.py). Workers talk back over one queue: their events, which a relay
thread publishes on rank 0's bus, and their last words if they fail.

A worker that dies ends the run with one line, never a hang: the relay thread notices the exit within
``POLL_S``, records why and publishes a fatal ``error`` event naming the rank; the step that was
running fails (gloo fails at once on the closed socket; a CUDA step stuck in NCCL is aborted after
``ABORT_AFTER_S``, and if even that does not free it — or the shutdown after it hangs — the process
exits with the line after ``EXIT_AFTER_S``) and surfaces as ``TensorParallelError``. A failure on rank 0
inside a call the workers mirror ends the group too: its ranks would no longer agree on which
collective comes next.
"""

from __future__ import annotations

import os
import queue as queue_mod
import shutil
import signal
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

import torch
import torch.multiprocessing as torch_mp

from ..errors import EngineError, TensorParallelError
from ..kernel_config import KernelConfig
from ..memory_plan import MemoryPlan
from ..telemetry import events as ev
from .collectives import TorchCollectives, build_collectives
from .lockstep import MirroredModelRunner
from .process_group import RankGroup, group_in_use, join_group, multicast_off, rank_device
from .setup import RankSetup, agree_plan
from .wire import encode_control
from .worker import WorkerArgs, worker_main

POLL_S = 0.1
READY_TIMEOUT_S = 600.0
ABORT_AFTER_S = 5.0
EXIT_AFTER_S = 20.0


_NO_MAIN_GUARD = (
    "it ended before it started (if the program builds the engine at import time, put that under "
    '`if __name__ == "__main__":`: each worker is a spawned process that imports the main module again)'
)
"""What a worker that exits 1 before it reports ready most likely hit: multiprocessing's "bootstrapping
phase" error, printed in the worker's stderr only (the parent said just "exit code 1")."""


class TensorParallelGroup:
    """Built by ``start``; the engine holds it as ``engine.tp`` (``comm``: rank 0's collectives,
    ``worker_pids``, ``failure``: why the group ended, or None)."""

    def __init__(self, size: int, device: torch.device, publish: Callable[[ev.Event], None]) -> None:
        self.size = size
        self.publish = publish
        self.device = rank_device(device, 0)
        self.store_dir = tempfile.mkdtemp(prefix="graphtop-tp-")
        self.ctx = torch_mp.get_context("spawn")
        self.queue: Any = self.ctx.Queue()
        self.procs: list[Any] = []
        self.pipes: list[Any] = []
        self.worker_pids: dict[int, int] = {}
        self.errors: dict[int, str] = {}  # a worker's last words
        self.failure: Optional[str] = None
        self._stuck_since: Optional[float] = None  # since when a failed group has kept rank 0 busy
        self.busy = False  # rank 0 is inside a step (the watchdog may have to free it)
        self.in_call = False  # inside a call the workers mirror (MirroredModelRunner)
        self.closing = False
        self.rank_group: Optional[RankGroup] = None
        self.comm: Optional[TorchCollectives] = None
        self._stop = threading.Event()
        self._relay: Optional[threading.Thread] = None
        self._aborted = False

    # --- start -------------------------------------------------------------------------------------
    @classmethod
    def start(
        cls,
        size: int,
        device: torch.device,
        dtype: torch.dtype,
        meta: Any,
        kernels: KernelConfig,
        publish: Callable[[ev.Event], None],
    ) -> "TensorParallelGroup":
        """Spawn ranks 1..size-1, join the group as rank 0, set up the collectives. ``meta``: the
        checkpoint as rank 0 read it (``models.loader.CheckpointMeta``): workers get its path and spec."""
        problem = group_in_use()
        if problem:
            raise EngineError(problem)
        if device.type == "cuda" and (device.index or 0) + size > torch.cuda.device_count():
            raise EngineError(f"--tp {size} needs {size} GPUs from {device}; torch sees {torch.cuda.device_count()}")
        multicast_off()  # before the spawn: the workers inherit it
        group = cls(size, device, publish)
        try:
            store = os.path.join(group.store_dir, "store")
            for rank in range(1, size):
                args = WorkerArgs(
                    rank,
                    size,
                    store,
                    str(device),
                    str(dtype).replace("torch.", ""),
                    str(meta.path),
                    meta.spec,
                    torch.get_num_threads(),
                    kernels.all_reduce,
                    meta.allow_external_weights,
                )
                reader, writer = group.ctx.Pipe(duplex=False)
                proc = group.ctx.Process(
                    target=worker_main, args=(args, reader, group.queue), daemon=True, name=f"graphtop-tp-rank{rank}"
                )
                proc.start()
                reader.close()
                group.procs.append(proc)
                group.pipes.append(writer)
            group._wait_ready()
            group.rank_group = join_group(0, size, group.device, store)
            group.comm = build_collectives(group.rank_group, dtype, kernels.all_reduce)
        except BaseException as e:
            failure = group.await_failure(2.0)
            group.close()
            if failure and not isinstance(e, KeyboardInterrupt):
                raise TensorParallelError(failure) from None
            raise
        group._relay = threading.Thread(target=group._relay_loop, name="graphtop-tp-relay", daemon=True)
        group._relay.start()
        return group

    def _wait_ready(self) -> None:
        waiting = set(range(1, self.size))
        deadline = time.monotonic() + READY_TIMEOUT_S
        while waiting:
            try:
                self._handle(self.queue.get(timeout=POLL_S))
            except queue_mod.Empty:
                pass
            waiting -= set(self.worker_pids)
            self._check_workers()
            if self.failure:
                raise TensorParallelError(self.failure)
            if time.monotonic() > deadline:
                raise TensorParallelError(
                    f"tensor-parallel ranks {sorted(waiting)} did not start in {READY_TIMEOUT_S:.0f} s"
                )

    # --- what rank 0's engine calls -------------------------------------------------------------------
    def send(self, message: Any) -> None:
        """To every worker, in rank order."""
        for rank, pipe in enumerate(self.pipes, start=1):
            try:
                pipe.send_bytes(message)
            except OSError:
                raise TensorParallelError(self.await_failure(2.0) or f"tensor-parallel rank {rank} is gone") from None

    def plan_kv_pool(self, inputs: dict[str, Any], local: MemoryPlan) -> MemoryPlan:
        """Rank 0's plan made from ``inputs`` (minus its weights), agreed with every worker's."""
        self.send(encode_control("plan", inputs))
        assert self.rank_group is not None
        return agree_plan(self.rank_group, local)

    def model_runner(self, *args: Any, setup: RankSetup, **kwargs: Any) -> MirroredModelRunner:
        """Rank 0's model runner; the workers build theirs from ``setup`` first."""
        self.send(encode_control("setup", setup))
        return MirroredModelRunner(*args, group=self.rank_group, link=self, **kwargs)

    @contextmanager
    def step_guard(self) -> Iterator[None]:
        """Around every step: no step after a failure. A failure inside a mirrored call, or a worker's
        death, ends the group; any other error is the step's own (the ranks are still in step)."""
        if self.failure:
            raise TensorParallelError(self.failure)
        self.busy = True
        try:
            yield
        except TensorParallelError:
            raise
        except Exception as e:
            failure = self.await_failure(2.0 if self.in_call else 0.2)
            if failure is None and not self.in_call:
                raise
            if failure is None:  # rank 0's own failure (a worker's death was published when noticed)
                failure = f"tensor-parallel step failed on rank 0 ({type(e).__name__}: {e})".splitlines()[0][:300]
                self.failure = failure
                self.publish(ev.ErrorEvent(message=failure, where="tensor-parallel", fatal=True, rank=0))
            raise TensorParallelError(failure) from e
        finally:
            self.busy = False

    def await_failure(self, timeout: float) -> Optional[str]:
        """The recorded failure, waiting up to ``timeout`` for a worker's exit to be noticed."""
        deadline = time.monotonic() + timeout
        while self.failure is None and time.monotonic() < deadline:
            if self._relay is None or not self._relay.is_alive():
                self._drain()
                self._check_workers()
            time.sleep(POLL_S / 2)
        return self.failure

    # --- the relay thread ----------------------------------------------------------------------------
    def _relay_loop(self) -> None:
        while not self._stop.is_set():
            self._drain(block=True)
            self._check_workers()
            self._watchdog()

    def _drain(self, block: bool = False) -> None:
        try:
            item = self.queue.get(timeout=POLL_S) if block else self.queue.get_nowait()
            while True:
                self._handle(item)
                item = self.queue.get_nowait()
        except queue_mod.Empty:
            pass
        except (EOFError, OSError, ValueError):  # the queue was closed under us (shutdown)
            self._stop.set()

    def _handle(self, item: tuple[Any, ...]) -> None:
        kind = item[0]
        if kind == "event":
            self.publish(ev.event_from_dict(item[1]))
        elif kind == "error":
            self.errors[item[1]] = item[2]
        elif kind == "ready":
            self.worker_pids[item[1]] = item[2]

    def _check_workers(self) -> None:
        if self.failure is not None or self.closing:
            return
        for rank, proc in enumerate(self.procs, start=1):
            if proc.is_alive():
                continue
            self._drain()  # its last words may still be in the queue
            code = proc.exitcode
            how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
            said = self.errors.get(rank) or (_NO_MAIN_GUARD if code == 1 and rank not in self.worker_pids else None)
            self.failure = f"tensor-parallel rank {rank} died ({how})" + (f": {said}" if said else "")
            self.publish(ev.ErrorEvent(message=self.failure, where="tensor-parallel", fatal=True, rank=rank))
            return

    def _watchdog(self) -> None:
        """A step (or the shutdown after it) stuck in a collective with a dead peer (NCCL waits forever):
        abort the communicators, then exit with the line."""
        if self.failure is None or not (self.busy or self.closing):
            self._stuck_since = None
            return
        now = time.monotonic()
        if self._stuck_since is None:
            self._stuck_since = now
        waited = now - self._stuck_since
        if waited > ABORT_AFTER_S and not self._aborted:
            self._aborted = True
            _abort_collectives()
        elif waited > EXIT_AFTER_S:
            print(f"graphtop: error: {self.failure}", file=sys.stderr, flush=True)
            os._exit(1)

    # --- shutdown ------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the workers (they release their graphs before leaving the group), then leave it."""
        if self.closing:
            return
        self.closing = True
        if self.failure is None and self.procs:
            try:
                self.send(encode_control("stop"))
            except TensorParallelError:
                pass
        if self.rank_group is not None:  # at the same time as the workers, as any torch.distributed program ends
            if self.failure is not None:
                _abort_collectives()
            self.rank_group.leave()
            self.rank_group = None
        for proc in self.procs:
            proc.join(10.0 if self.failure is None else 0.5)
            if proc.is_alive():
                proc.kill()
                proc.join(5.0)
        for pipe in self.pipes:
            pipe.close()
        self._stop.set()
        if self._relay is not None and self._relay is not threading.current_thread():
            self._relay.join(5.0)
        self._drain()  # events the workers sent while stopping
        self.queue.close()
        self.queue.join_thread()
        shutil.rmtree(self.store_dir, ignore_errors=True)


def _abort_collectives() -> None:
    """Abort NCCL communicators so that a collective waiting on a dead peer returns (no-op on gloo)."""
    if not torch.cuda.is_available():
        return
    try:
        from torch.distributed.distributed_c10d import _abort_process_group

        _abort_process_group()
    except Exception:  # not in this torch, or nothing to abort
        pass
