"""Event-stream overhead: decode step time with a trace recorder subscribed ÷ with no subscriber.

    python bench/events_bench.py [--device cpu|cuda] [--shape qwen3-0.6b] [--bs 1] [--steps 200] [--rounds 7]

CPU uses the demo model (emulated graphs); CUDA a random-weight model of ``--shape``. Rounds alternate
off/on on the same engine and running requests; medians are compared. bench/graph_bench.py reports the
same ratio inside the full GPU benchmark.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402

from graphtop.engine.config import EngineConfig  # noqa: E402
from graphtop.engine.engine import Engine  # noqa: E402
from graphtop.engine.telemetry.bus import EventBus  # noqa: E402
from graphtop.engine.telemetry.recorder import TraceRecorder  # noqa: E402
from graphtop.engine.sampling_params import SamplingParams  # noqa: E402


def build(device: str, shape: str) -> Engine:
    if device == "cpu":
        return Engine.from_pretrained(None, config=EngineConfig(device="cpu", capture_before_serving=True),
                                       bus=EventBus())
    from graphtop.models.synthetic.random_model import hf_config_for, random_checkpoint

    ckpt = random_checkpoint(hf_config_for(shape), device="cuda", dtype=torch.bfloat16)
    return Engine(ckpt, EngineConfig(device="cuda", dtype="bfloat16", max_context_len=4096,
                                     max_total_tokens=65536, capture_before_serving=True), EventBus())


def timed(engine: Engine, steps: int, sync) -> float:
    sync()
    t = time.perf_counter()
    for _ in range(steps):
        engine.step()
    sync()
    return (time.perf_counter() - t) / steps * 1e3


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shape", default="qwen3-0.6b")
    ap.add_argument("--bs", type=int, default=1)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    engine = build(args.device, args.shape)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    vocab = engine.spec.vocab_size
    g = torch.Generator().manual_seed(0)

    def fresh_batch() -> None:
        """bs new requests, prefilled (untimed), each with room for exactly the timed decode steps."""
        params = SamplingParams(max_new_tokens=args.steps + 2, ignore_eos=True, detokenize=False)
        for _ in range(args.bs):
            engine.submit(torch.randint(10, vocab - 10, (32,), generator=g).tolist(), params)
        while engine.scheduler.waiting or any(r.in_prefill for r in engine.scheduler.running):
            engine.step()

    def measure() -> float:
        fresh_batch()
        ms = timed(engine, args.steps, sync)
        engine.run_until_idle()
        return ms

    measure()  # warm-up
    off, on = [], []
    for _ in range(args.rounds):
        off.append(measure())
        rec = TraceRecorder(str(Path(tempfile.mkdtemp()) / "t.jsonl"), engine.bus, header_meta={})
        on.append(measure())
        rec.close()
    ratio = statistics.median(on) / statistics.median(off)
    print(f"events on/off, {args.device}, bs {args.bs}, decode graph path "
          f"({engine.model_runner.decode_backend_label}): {statistics.median(on):.4f} / "
          f"{statistics.median(off):.4f} ms = {ratio:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
