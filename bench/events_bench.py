"""Event-stream overhead: decode step time with a trace recorder subscribed ÷ with no subscriber.

    python3 bench/events_bench.py [--device cpu|cuda] [--shape qwen3-0.6b] [--bs 1] [--steps 200] [--rounds 7]

CPU uses the demo model (emulated graphs); CUDA a random-weight model of ``--shape``. Rounds alternate off/on
on the same engine, each timing a fresh batch over the same span of contexts; medians are compared.
bench/graph_bench.py reports the same ratio (``events_overhead``, below) inside the full GPU benchmark.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
from harness import fill_decode, log, make_engine, random_ckpt, refuse_past_context, sync_for, time_steps

from graphtop.engine.telemetry.recorder import TraceRecorder

EVENTS_PROMPT = 32


def events_overhead(engine: Any, bs: int, steps: int, rounds: int, sync: Callable[[], None]) -> dict[str, float]:
    """Median step ms with a trace recorder subscribed (``on_ms``) and without (``off_ms``), in rounds that
    alternate off, on; each measurement prefills ``bs`` fresh requests (untimed), times ``steps`` decode
    steps and serves the rest, so every measurement covers the same contexts."""

    def measure() -> float:
        fill_decode(engine, bs, prompt_len=EVENTS_PROMPT, max_new_tokens=steps + 2)
        ms = time_steps(engine, steps, sync)
        engine.run_until_idle()
        return ms

    measure()  # warm-up
    off, on = [], []
    for _ in range(rounds):
        off.append(measure())
        with tempfile.TemporaryDirectory(prefix="gt-events-") as tmp:
            rec = TraceRecorder(str(Path(tmp) / "trace.jsonl"), engine.bus, header_meta={"bench": "events"})
            try:
                on.append(measure())
            finally:
                rec.close()
    off_ms, on_ms = statistics.median(off), statistics.median(on)
    return {"off_ms": off_ms, "on_ms": on_ms, "ratio": on_ms / off_ms}


def build(device: str, shape: str, bs: int) -> Any:
    if device == "cpu":
        from graphtop.engine.config import EngineConfig
        from graphtop.engine.engine import Engine
        from graphtop.engine.telemetry.bus import EventBus

        return Engine.from_pretrained(
            None, config=EngineConfig(device="cpu", capture_before_serving=True), bus=EventBus()
        )
    return make_engine(random_ckpt(shape), max_running=max(8, bs))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shape", default="qwen3-0.6b", help="random-weight shape (CUDA)")
    ap.add_argument("--bs", type=int, default=1)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    refuse_past_context(ap, EVENTS_PROMPT + args.steps + 2, f"{args.steps} steps after a {EVENTS_PROMPT}-token prompt")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda needs a CUDA device (--device cpu runs on the demo model)")
    engine = build(args.device, args.shape, args.bs)
    try:
        r = events_overhead(engine, args.bs, args.steps, args.rounds, sync_for(args.device))
        log(
            f"events on/off, {args.device}, bs {args.bs}, decode graph path "
            f"({engine.model_runner.decode_backend_label}): {r['on_ms']:.4f} / {r['off_ms']:.4f} ms = {r['ratio']:.4f}"
        )
    finally:
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
