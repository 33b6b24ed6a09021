"""What the engine says about itself as it runs: step records, KV-pool state, the memory ledger.

Publishing never blocks and never adds a device sync: a step record reads its replay timing only
after the step's own sync, KV-pool state goes out at most every ``KV_EVENT_INTERVAL_S`` unless the
running/queued counts change, and without subscribers the per-step events are not even built.
"""

from __future__ import annotations

import time
from typing import Optional

import torch

from ..batch import ForwardBatch, ForwardMode
from ..graphs.model_runner import ModelRunner
from ..graphs.runners.base import StepOutput
from ..kv_pool import KVPool
from ..memory_plan import MemoryPlan
from ..scheduler import Scheduler
from ..telemetry import events as ev
from ..telemetry.bus import EventBus


class EngineEvents:
    KV_EVENT_INTERVAL_S = 0.05

    def __init__(
        self,
        bus: EventBus,
        device: torch.device,
        scheduler: Scheduler,
        pool: KVPool,
        plan: MemoryPlan,
        model_runner: ModelRunner,
        max_running: int,
        expert_bytes: int = 0,
    ):
        """``expert_bytes``: the model's expert weights (``models.layers.moe.expert_weight_bytes``), part of
        the plan's weights, shown apart in the memory ledger."""
        self.bus = bus
        self.expert_bytes = expert_bytes
        self.device = device
        self.scheduler = scheduler
        self.pool = pool
        self.plan = plan
        self.model_runner = model_runner
        self.max_running = max_running
        self._kv_key: tuple[int, int] = (-1, -1)
        self._kv_time = 0.0

    def publish(self, event: ev.Event) -> None:
        self.bus.publish(event)

    def step(
        self, step_no: int, batch: ForwardBatch, out: StepOutput, host_ms: float, launch_ms: Optional[float] = None
    ) -> None:
        if not self.bus.has_subscribers:
            return
        real = batch.batch_size if batch.mode is ForwardMode.DECODE else batch.num_tokens
        replay_ms, segment_ms, break_ms = out.read_timing()
        self.publish(
            ev.StepEvent.fast(
                step=step_no,
                phase=batch.mode.value,
                batch_size=batch.batch_size,
                num_tokens=batch.num_tokens,
                bucket=out.bucket,
                padded=out.padded,
                padding_waste=(out.padded / (real + out.padded)) if out.padded else 0.0,
                path=out.path,
                fallback_reason=out.fallback_reason.value if out.fallback_reason else None,
                host_ms=round(host_ms, 4),
                replay_ms=_round(replay_ms),
                segment_ms=_round(segment_ms),
                break_ms=_round(break_ms),
                forward_ms=_round(out.read_forward_ms()),
                launch_ms=_round(launch_ms),
                emulated=self.model_runner.emulated and out.path == "graph",
            )
        )

    def kv(self, force: bool = False) -> None:
        """KV state at most every 50 ms, or at once when the running/queued counts change."""
        if not self.bus.has_subscribers:
            return
        scheduler = self.scheduler
        now = time.perf_counter()
        key = (len(scheduler.running), len(scheduler.waiting))
        if not force and key == self._kv_key and now - self._kv_time < self.KV_EVENT_INTERVAL_S:
            return
        self._kv_key, self._kv_time = key, now
        self.publish(self.kv_state())

    def kv_state(self) -> ev.KVPoolState:
        scheduler, pool = self.scheduler, self.pool
        return ev.KVPoolState.fast(  # type: ignore[return-value]
            capacity_tokens=pool.capacity_tokens,
            used_tokens=scheduler.used_tokens,
            page_size=pool.page_size,
            running=len(scheduler.running),
            queued=len(scheduler.waiting),
            max_running=self.max_running,
        )

    def memory_ledger(self) -> None:
        self.publish(self.ledger())

    def ledger(self) -> ev.MemoryLedger:
        plan, pool = self.plan, self.pool
        decode_b, prefill_b = self.model_runner.graph_memory()
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
        else:
            total = plan.weights_bytes + pool.nbytes
            free = 0
        return ev.MemoryLedger(
            device=str(self.device),
            total=int(total),
            weights=int(plan.weights_bytes),
            kv_pool=int(pool.nbytes),
            decode_graphs=int(decode_b),
            prefill_graphs=int(prefill_b),
            activation_reserve=int(plan.activation_reserve_bytes),
            free=int(free),
            experts=int(self.expert_bytes),
        )


def _round(v: Optional[float]) -> Optional[float]:
    return None if v is None else round(v, 4)
