"""A worker rank: a spawned process that holds one shard of the model and follows rank 0's calls.

It joins the group, loads its shard, then serves messages from rank 0 until told to stop: the memory
plan (its own free memory, then the group's minimum), the setup rank 0 decided (attention backend,
kernels, resolved graph config), captures, and one forward per step. It never schedules or samples.
Its capture events and memory ledger go to rank 0 through a queue with its ``rank`` set, and so do
its replay times (``RankReplay``, batched). If rank 0's process goes away, the worker exits.

Nothing here decides a policy: every decision arrives from rank 0, or is the same function rank 0
calls (``plan_kv_pool``, ``select_attention_backend``, the runners).
"""

from __future__ import annotations

import dataclasses
import faulthandler
import multiprocessing
import os
import signal
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Optional

import torch

from graphtop.models.kernels.argmax import argmax_rows
from graphtop.models.layers.moe import expert_weight_bytes
from graphtop.models.loader import load_weights
from graphtop.models.parallel import TensorParallel
from graphtop.models.spec import ModelSpec

from ..attention.base import AttentionShape
from ..attention.select import select_attention_backend
from ..graphs.runners.base import StepOutput
from ..kv_pool import KVLayout, KVPool
from ..memory_plan import MemoryPlan, plan_kv_pool
from ..step.events import EngineEvents
from ..telemetry import events as ev
from .collectives import build_collectives
from .lockstep import LockstepModelRunner
from .process_group import RankGroup, join_group, rank_device
from .setup import RankSetup, agree_plan
from .wire import FORWARD, ForwardDecoder, decode_control

POLL_S = 0.05
"""How long a worker waits for a message before it checks on rank 0 and sends its replay times."""
REPLAY_BATCH_S = 0.05
"""At most this often a worker sends its replay times to rank 0."""
PARENT_CHECK_S = 1.0


@dataclass(frozen=True)
class WorkerArgs:
    rank: int
    size: int
    store_path: str
    device: str  # the group's base device ("cpu", "cuda:0"); the rank picks its own from it
    dtype: str
    model_path: str
    spec: ModelSpec  # the whole model's, as rank 0 read it (the worker never parses the config)
    threads: int  # torch intra-op threads, as rank 0 has them
    all_reduce: str  # KernelConfig.all_reduce
    allow_external_weights: bool = False  # as rank 0 was told (EngineConfig.allow_external_weights)


class ParentGone(Exception):
    """Rank 0's process ended: nothing to serve any more."""


def worker_main(args: WorkerArgs, conn: Any, queue: Any) -> None:
    """Entry point of a spawned worker process (``torch.multiprocessing``, spawn context).

    ``kill -USR1`` on a worker prints its threads' stacks to stderr: where a rank waits when a run
    hangs (the worker has no terminal of its own to interrupt)."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    group: Optional[RankGroup] = None
    server: Optional[RankServer] = None
    threading.Thread(target=_exit_with_parent, name="graphtop-tp-orphan-watch", daemon=True).start()
    try:
        torch.set_num_threads(args.threads)
        device = rank_device(torch.device(args.device), args.rank)
        queue.put(("ready", args.rank, os.getpid()))
        group = join_group(args.rank, args.size, device, args.store_path)
        dtype = getattr(torch, args.dtype)
        comm = build_collectives(group, dtype, args.all_reduce)
        model = load_weights(
            args.model_path,
            args.spec,
            device,
            dtype,
            TensorParallel(args.rank, args.size, comm),
            allow_external_weights=args.allow_external_weights,
        )
        server = RankServer(group, model, conn, queue)
        server.serve()
    except ParentGone:
        pass
    except BaseException as e:  # noqa: BLE001 - reported to rank 0, which ends the run with it
        try:
            queue.put(("error", args.rank, f"{type(e).__name__}: {e}".splitlines()[0][:300]))
            queue.close()
            queue.join_thread()
        finally:
            os._exit(1)
    finally:
        if server is not None:
            server.release()
        if group is not None:
            group.leave()


def _exit_with_parent() -> None:
    """Rank 0's process gone (even killed) while this one waits in a collective that can never
    finish: end, rather than hold a GPU as an orphan."""
    parent = multiprocessing.parent_process()
    while parent is not None:
        parent.join(PARENT_CHECK_S)
        if not parent.is_alive():
            os._exit(1)


class _Outbox:
    """``EngineEvents``' bus on a worker: every event that has a ``rank`` goes to rank 0 with this
    rank's number; the rest (e.g. recapture results) rank 0 reports itself."""

    has_subscribers = True

    def __init__(self, rank: int, queue: Any) -> None:
        self.rank, self.queue = rank, queue

    def publish(self, event: ev.Event) -> None:
        if "rank" in {f.name for f in dataclasses.fields(event)}:
            self.queue.put(("event", replace(event, rank=self.rank).to_dict()))


class RankServer:
    def __init__(self, group: RankGroup, model: torch.nn.Module, conn: Any, queue: Any) -> None:
        self.group = group
        self.model = model
        self.device = group.device
        self.dtype = next(self.model.parameters()).dtype
        self.conn = conn
        self.outbox = _Outbox(group.rank, queue)
        self.parent = multiprocessing.parent_process()
        self.decoder = ForwardDecoder()
        self.plan: Optional[MemoryPlan] = None
        self.pool: Optional[KVPool] = None
        self.runner: Optional[LockstepModelRunner] = None
        self.events: Optional[EngineEvents] = None
        self.last: Optional[StepOutput] = None  # the previous step's output (its logits feed IDS_ON_DEVICE)
        self.timings: list[tuple[int, StepOutput]] = []  # replays whose times are not read yet
        self.replays: list[tuple[int, float]] = []  # read, not sent yet
        self.sent_at = time.perf_counter()

    # --- the loop -------------------------------------------------------------------------------
    def serve(self) -> None:
        while True:
            message = self._receive()
            if message[:1] == FORWARD:
                self.forward(message)
                continue
            name, args = decode_control(message)
            if name == "stop":
                return
            getattr(self, f"on_{name}")(*args)

    def _receive(self) -> bytes:
        while not self.conn.poll(POLL_S):
            if self.parent is not None and not self.parent.is_alive():
                raise ParentGone()
            self._read_timings(keep_last=False)  # idle: every launched step has finished
            self._send_replays(force=True)
        try:
            return self.conn.recv_bytes()
        except (EOFError, OSError):
            raise ParentGone() from None

    # --- control messages (same order and arguments as rank 0's calls) -----------------------------
    def on_plan(self, inputs: dict[str, Any]) -> None:
        """Plan the KV pool from this rank's memory, agree with the group, allocate it."""
        weights = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self.plan = agree_plan(self.group, plan_kv_pool(device=self.device, weights_bytes=weights, **inputs))
        spec = self.model.spec
        layout = KVLayout(spec.num_layers, spec.num_kv_heads, spec.head_dim, self.dtype)
        self.pool = KVPool(layout, self.plan.num_pages, self.plan.page_size, self.device)

    def on_setup(self, setup: RankSetup) -> None:
        assert self.pool is not None and self.plan is not None
        spec = self.model.spec
        shape = AttentionShape.of(spec)
        attention, _ = select_attention_backend(setup.attention_backend, self.pool, shape, self.device, setup.kernels)
        if setup.fused_kernels:
            k = setup.kernels
            self.model.enable_fused_kernels(
                setup.fused_gemv_max_rows,
                gemv=k.gemv_layers,
                pdl=k.pdl,
                skinny=k.skinny_layers,
                packed=k.skinny_packed,
                fused_mlp=k.fused_mlp,
            )
        self.runner = LockstepModelRunner(
            self.model,
            attention,
            self.device,
            setup.resolved,
            setup.max_pages,
            self.outbox.publish,
            freeze_gc=setup.freeze_gc,
            group=self.group,
        )
        self.events = EngineEvents(
            self.outbox,
            self.device,
            None,
            self.pool,
            self.plan,  # type: ignore[arg-type]
            self.runner,
            0,
            expert_bytes=expert_weight_bytes(self.model),
        )

    def on_start_capture(self) -> None:
        assert self.runner is not None and self.events is not None
        self.runner.start_capture()
        self.events.memory_ledger()

    def on_recapture(self, decode_bs: Any, prefill_tokens: Any) -> None:
        assert self.runner is not None and self.events is not None
        self.runner.recapture(decode_bs, prefill_tokens)
        self.events.memory_ledger()

    def on_advance_capture(self, to_the_end: bool) -> None:
        assert self.runner is not None and self.events is not None
        if self.runner.advance_capture(to_the_end=to_the_end):
            self.events.memory_ledger()

    def on_release(self) -> None:
        self.release()

    # --- forward steps -----------------------------------------------------------------------------
    def forward(self, message: bytes) -> None:
        assert self.runner is not None
        step = self.decoder.decode(message)
        if step.ids_on_device:
            assert self.last is not None, "device ids without a previous step"
            step.batch.input_ids_device = argmax_rows(self.last.logits)  # rank 0's tokens, bit for bit
        self._read_timings(keep_last=True)
        out = self.runner.forward(step.batch)
        self.last = out
        if out.timing is not None:
            self.timings.append((step.seq, out))
        self._send_replays(force=False)

    def _read_timings(self, keep_last: bool) -> None:
        """Replay times of finished steps: all but the newest while steps stream (its work may still
        run, under the overlap schedule), all of them when idle."""
        ready = self.timings[:-1] if keep_last else self.timings
        for seq, out in ready:
            try:
                replay_ms = out.read_timing()[0]
            except RuntimeError:  # not finished after all: the time is lost, not waited for
                replay_ms = None
            if replay_ms is not None:
                self.replays.append((seq, round(replay_ms, 4)))
        self.timings = self.timings[len(ready) :]

    def _send_replays(self, force: bool) -> None:
        now = time.perf_counter()
        if not self.replays or (not force and now - self.sent_at < REPLAY_BATCH_S):
            return
        steps, times = zip(*self.replays)
        self.outbox.publish(ev.RankReplay(rank=self.group.rank, steps=steps, replay_ms=times))
        self.replays = []
        self.sent_at = now

    def release(self) -> None:
        """Graphs first (they hold collectives), before the group is destroyed."""
        if self.runner is not None:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.runner.release()
        self.last = None
        self.timings = []
