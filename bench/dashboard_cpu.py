"""Dashboard CPU (GIL) cost under realistic engine traffic, without a GPU.

    python3 bench/dashboard_cpu.py [--seconds 10] [--steps-per-sec 500] [--no-device] [--profile OUT.prof]
                                  [--sim-engine] [--json OUT.json]

The dashboard runs in the main thread while the engine serves from its own thread of the same
process, so every millisecond the UI thread holds the GIL comes straight out of decode throughput.
This runs the real :class:`GraphtopApp` headless (``run_test(size=(200, 60))``, 15 Hz timer, every
panel live, device polling on) fed by a synthetic session that publishes what a bs-64 decode does:
``--steps-per-sec`` StepEvents (default 500), a KVPoolState at most every 50 ms, and a request
finishing/being replaced every so often (queued, prefill step, first token, finished).

It reports:

* ``ui_cpu_ms_per_s`` — CPU time of the UI (main) thread per wall second: the number to shrink;
* ``other_cpu_ms_per_s`` — CPU of every other thread except the producer (device poller, workers);
* ``pump_ms`` p50/p99/max — wall time of each timer tick's pump (drain + fold + widget updates; the
  compositor's repaint runs after it and is in ``ui_cpu`` only);
* with ``--sim-engine``: the producer becomes a GIL-hungry stand-in for the engine (each step does a
  little Python work between many short GIL-releasing waits, like kernel launches and syncs) and
  the steps/s it reaches with the dashboard ÷ without it — a directional proxy of the real ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

from graphtop.engine.telemetry.bus import EventBus
from graphtop.engine.telemetry.events import (
    KVPoolState,
    RequestFinished,
    RequestFirstToken,
    RequestQueued,
    StepEvent,
)
from graphtop.tui.sessions.base import Limits
from graphtop.tui.sessions.fake import boot_events

DECODE = (1, 2, 4, 8, 16, 24, 32, 48, 64)
PREFILL = (64, 128, 256, 512, 1024, 2048)


def _spin(seconds: float) -> None:
    """Hold the GIL doing Python work for about ``seconds`` (the engine's host-side step work)."""
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


class SyntheticSession:
    """A live session whose engine is a thread publishing bs-64 decode traffic to a real EventBus."""

    kind = "live"
    label = "synthetic bs-64 decode"
    replay = None
    hosts_engine = True  # the stand-in engine thread shares this process, as an in-process engine would
    detaches = False
    ended = None
    silent_for = None  # the stand-in publishes from this process: it cannot go silent
    parity_every = 0

    def __init__(
        self,
        steps_per_sec: float = 500.0,
        bs: int = 64,
        sim_engine: bool = False,
        step_gil_s: float = 0.0003,
        releases_per_step: int = 10,
    ) -> None:
        self.steps_per_sec = steps_per_sec
        self.bs = bs
        self.sim_engine = sim_engine
        self.step_gil_s = step_gil_s
        self.releases_per_step = releases_per_step
        self.bus = EventBus()
        self.sub = self.bus.subscribe("tui", maxsize=50_000)
        self._stop = threading.Event()
        self.thread: Optional[threading.Thread] = None
        self.steps = 0
        self.native_id: Optional[int] = None

    # -- the fake engine ---------------------------------------------------------------------
    def start(self) -> None:
        for ev in boot_events(DECODE, PREFILL, model="Qwen/Qwen3-0.6B", ts=time.time()):
            self.bus.publish(ev)
        self.thread = threading.Thread(target=self._run, name="synthetic-engine", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.native_id = threading.get_native_id()
        publish = self.bus.publish
        period = 1.0 / self.steps_per_sec
        bs, cap = self.bs, 65536
        next_kv = 0.0
        next_req = 0.0
        req = 0
        t_next = time.perf_counter()
        while not self._stop.is_set():
            now = time.perf_counter()
            if self.sim_engine:
                # host work between GIL-releasing waits (launches, syncs); rate is whatever we reach
                slice_s = self.step_gil_s / self.releases_per_step
                for _ in range(self.releases_per_step):
                    _spin(slice_s)
                    time.sleep(period / self.releases_per_step / 4)
            else:
                if now < t_next:
                    time.sleep(t_next - now)
                t_next += period
                if time.perf_counter() - t_next > 0.5:  # fell far behind: do not burst
                    t_next = time.perf_counter()
            self.steps += 1
            i = self.steps
            ts = time.time()
            if now >= next_req:  # a request finishes and a new one is prefilled in its slot
                next_req = now + 0.25
                req += 1
                rid = f"req-{req}"
                publish(
                    RequestFinished(
                        request_id=f"req-{req - 1}", output_tokens=256, finish_reason="length", latency_ms=540.0, ts=ts
                    )
                )
                publish(RequestQueued(request_id=rid, prompt_tokens=128, max_new_tokens=256, ts=ts))
                publish(
                    StepEvent(
                        step=i,
                        phase="prefill",
                        batch_size=1,
                        num_tokens=128,
                        bucket=128,
                        padded=0,
                        padding_waste=0.0,
                        path="graph",
                        host_ms=0.35,
                        replay_ms=1.9,
                        segment_ms=1.2,
                        break_ms=0.4,
                        ts=ts,
                    )
                )
                publish(RequestFirstToken(request_id=rid, ttft_ms=4.1, ts=ts))
                continue
            if i % 97 == 0:
                publish(
                    StepEvent(
                        step=i,
                        phase="decode",
                        batch_size=bs,
                        num_tokens=bs,
                        bucket=None,
                        path="eager",
                        fallback_reason="sampling params need eager",
                        host_ms=3.1,
                        ts=ts,
                    )
                )
            else:
                publish(
                    StepEvent(
                        step=i,
                        phase="decode",
                        batch_size=bs,
                        num_tokens=bs,
                        bucket=64,
                        padded=0,
                        padding_waste=0.0,
                        path="graph",
                        host_ms=0.28,
                        replay_ms=1.6 + (i % 11) * 0.01,
                        ts=ts,
                    )
                )
            if now >= next_kv:
                next_kv = now + 0.05
                publish(
                    KVPoolState(
                        capacity_tokens=cap,
                        used_tokens=(bs * (128 + i % 256)) % cap,
                        page_size=16,
                        running=bs,
                        queued=i % 3,
                        max_running=bs,
                        ts=ts,
                    )
                )

    # -- Session protocol ---------------------------------------------------------------------
    def drain(self, max_items: Optional[int] = None) -> list:
        return self.sub.drain(max_items)

    @property
    def dropped(self) -> int:
        return self.sub.dropped

    can_submit = True
    chat_available = False

    def submit(self, prompt, settings, chat):  # pragma: no cover - not exercised here
        raise RuntimeError("synthetic session takes no prompts")

    def recapture(self, decode_bs, prefill_num_tokens) -> None:  # pragma: no cover
        raise RuntimeError("synthetic session cannot recapture")

    def set_parity_every(self, every: int) -> None:  # pragma: no cover
        raise RuntimeError("synthetic session runs no parity checks")

    def buckets(self):
        return list(DECODE), list(PREFILL)

    def limits(self) -> Limits:
        return Limits(max_running=self.bs, kv_capacity_tokens=65536)

    def drain_logs(self) -> list[tuple[int, str]]:
        return []

    def shutdown(self) -> None:
        self._stop.set()
        if self.thread is not None:
            self.thread.join(2)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(int(q * len(s)), len(s) - 1)]


def _thread_cpu(exclude: set[int]) -> float:
    """CPU seconds of this process's threads other than ``exclude`` and the main thread."""
    try:
        import psutil
    except ImportError:  # pragma: no cover
        return float("nan")
    main = threading.main_thread().native_id
    return sum(t.user_time + t.system_time for t in psutil.Process().threads() if t.id not in exclude and t.id != main)


def _headless_sim_rate(args: argparse.Namespace) -> float:
    """Steps/s the simulated engine reaches with nobody watching (drains its own queue)."""
    session = SyntheticSession(args.steps_per_sec, sim_engine=True)
    session.start()
    time.sleep(args.warmup)
    s0, t0 = session.steps, time.perf_counter()
    while time.perf_counter() - t0 < args.seconds:
        time.sleep(0.1)
        session.drain()
    rate = (session.steps - s0) / (time.perf_counter() - t0)
    session.shutdown()
    return rate


async def _measure(args: argparse.Namespace) -> dict[str, Any]:
    from graphtop.tui.app import GraphtopApp

    session = SyntheticSession(args.steps_per_sec, sim_engine=args.sim_engine)
    app = GraphtopApp(session, poll_device=not args.no_device)  # the defaults a user gets
    pump_ms: list[float] = []
    real_pump = app.pump

    def timed_pump(*a: Any, **kw: Any) -> int:
        t = time.perf_counter()
        n = real_pump(*a, **kw)
        if recording:
            pump_ms.append((time.perf_counter() - t) * 1e3)
        return n

    app.pump = timed_pump  # type: ignore[method-assign]  # before mount: the timer binds this
    recording = False
    profiler = None
    async with app.run_test(size=(200, 60)) as pilot:
        while not app.engine_ready:
            await pilot.pause(0.05)
        await asyncio.sleep(args.warmup)
        if args.profile:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        exclude = {session.native_id} if session.native_id else set()
        recording = True
        steps0, seen0 = session.steps, app.state.total_steps
        ui0, other0, t0 = time.thread_time(), _thread_cpu(exclude), time.perf_counter()
        await asyncio.sleep(args.seconds)
        ui1, other1, t1 = time.thread_time(), _thread_cpu(exclude), time.perf_counter()
        recording = False
        steps1, seen1 = session.steps, app.state.total_steps
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
        await pilot.pause(0.1)
    session.shutdown()
    wall = t1 - t0
    return {
        "seconds": round(wall, 2),
        "engine_steps_per_s": round((steps1 - steps0) / wall, 1),
        "ui_steps_seen_per_s": round((seen1 - seen0) / wall, 1),
        "ui_cpu_ms_per_s": round((ui1 - ui0) / wall * 1e3, 1),
        "other_cpu_ms_per_s": round((other1 - other0) / wall * 1e3, 1),
        "pumps_per_s": round(len(pump_ms) / wall, 1),
        "pump_ms_p50": round(_pct(pump_ms, 0.5), 3),
        "pump_ms_p99": round(_pct(pump_ms, 0.99), 3),
        "pump_ms_max": round(max(pump_ms, default=float("nan")), 3),
        "pump_ms_mean": round(statistics.fmean(pump_ms), 3) if pump_ms else None,
        "dropped": session.dropped,
    }


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--steps-per-sec", type=float, default=500.0)
    ap.add_argument("--no-device", action="store_true", help="no NVML/psutil polling worker")
    ap.add_argument(
        "--sim-engine",
        action="store_true",
        help="producer contends for the GIL like the engine; report its rate vs headless",
    )
    ap.add_argument("--profile", metavar="OUT.prof", help="cProfile the UI thread during the measurement")
    ap.add_argument("--json", metavar="OUT.json")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    res = asyncio.run(_measure(args))
    if args.sim_engine:
        headless = _headless_sim_rate(args)
        res["sim_headless_steps_per_s"] = round(headless, 1)
        res["sim_ratio"] = round(res["engine_steps_per_s"] / headless, 3)
    for k, v in res.items():
        print(f"{k:>26}: {v}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
