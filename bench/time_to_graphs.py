"""Time until every graph is live on a CPU (emulated graphs): the demo model and a SmolLM2-135M-shaped one.

    python3 bench/time_to_graphs.py [--shapes demo,smollm2-135m] [--model DIR|FILE.gguf] [--forward-per-bucket]

For each model, with the default engine settings (serve while capturing, default bucket lists):

* load: checkpoint to an engine that serves (``Engine.from_pretrained``, or random weights of a
  published shape and ``Engine(...)``; torch and the engine modules are imported beforehand);
* capture: constructor return to ``wait_for_capture()`` on an idle engine, which captures flat out;
* first token: a second engine, a prompt submitted as soon as it is constructed, to its first token
  (the engine serves while it captures, so this does not wait for the capture).

Each figure is wall seconds and, in brackets, this process's CPU seconds (user + system, all threads):
on a shared machine the wall time grows with the load average, the CPU time much less.

``--forward-per-bucket`` also times one eager forward per bucket at the same lists: the work the
emulated capture did per bucket before it recorded the contract instead (minutes for SmolLM2-135M
on two cores). ``--model`` adds a real checkpoint: a folder, or a ``.gguf`` file (converted to a folder in
the user cache first, untimed; e.g. the SmolLM2-135M-Instruct GGUF of scripts/fetch_smollm2.py).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any, Callable

# Spinning OpenMP threads make small CPU forwards up to ~10x slower, and erratic, on a busy 2-core
# machine; set before torch loads OpenMP (an OMP_WAIT_POLICY already set is kept and printed).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from harness import checkpoint_folder, md_table, random_ckpt  # noqa: E402

from graphtop.engine.config import EngineConfig  # noqa: E402
from graphtop.engine.engine import Engine  # noqa: E402
from graphtop.engine.sampling_params import SamplingParams  # noqa: E402
from graphtop.engine.telemetry.bus import EventBus  # noqa: E402


def loader(name: str) -> Callable[[EventBus], Engine]:
    """A function that builds a fresh CPU engine for ``name`` (demo, a random shape, a folder or a GGUF)."""
    config = EngineConfig(device="cpu", dtype="float32")
    if name == "demo":
        return lambda bus: Engine.from_pretrained(None, config=config, bus=bus)
    if os.path.exists(name):
        folder = str(checkpoint_folder(name))
        return lambda bus: Engine.from_pretrained(folder, config=config, bus=bus)
    return lambda bus: Engine(random_ckpt(name, device="cpu", dtype=torch.float32), config, bus)


def forward_per_bucket(engine: Engine) -> float:
    """Seconds for one eager forward at every configured bucket (what capture used to run)."""
    t0 = time.perf_counter()
    for runner in (engine.model_runner.decode, engine.model_runner.prefill):
        for size in runner.configured if runner is not None else ():
            runner._prepare_capture(size)
            runner._forward(size)
    return time.perf_counter() - t0


def measure(name: str, with_forwards: bool) -> dict[str, Any]:
    build = loader(name)
    bus = EventBus()
    sub = bus.subscribe("capture", types={"capture_finished"})
    t0, c0 = time.perf_counter(), time.process_time()
    engine = build(bus)
    t1, c1 = time.perf_counter(), time.process_time()
    assert engine.wait_for_capture(timeout=600), "capture did not finish in 10 minutes"
    t2, c2 = time.perf_counter(), time.process_time()
    phases = {e.phase: e.seconds for e in sub.drain()}
    row: dict[str, Any] = dict(
        model=os.path.basename(os.path.normpath(name)),
        load_s=t1 - t0,
        load_cpu_s=c1 - c0,
        capture_s=t2 - t1,
        capture_cpu_s=c2 - c1,
        all_live_s=t2 - t0,
        all_live_cpu_s=c2 - c0,
        decode_buckets=len(engine.decode_buckets),
        prefill_buckets=len(engine.prefill_buckets),
        decode_capture_s=phases.get("decode"),
        prefill_capture_s=phases.get("prefill"),
    )
    if with_forwards:
        row["forward_per_bucket_s"] = forward_per_bucket(engine)
    engine.close()
    del engine

    engine = build(EventBus())
    t3, c3 = time.perf_counter(), time.process_time()
    handle = engine.submit(list(range(10, 42)), SamplingParams(max_new_tokens=1, ignore_eos=True, detokenize=False))
    engine.run_until_done([handle])
    row["first_token_s"], row["first_token_cpu_s"] = time.perf_counter() - t3, time.process_time() - c3
    row["capture_pending_at_first_token"] = engine.capture_pending
    engine.close()
    return row


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--shapes",
        default="demo,smollm2-135m",
        help="demo and/or random-weight shapes (models/synthetic/random_model.py)",
    )
    ap.add_argument(
        "--model", action="append", default=[], help="a checkpoint folder or .gguf file to add (repeatable)"
    )
    ap.add_argument("--forward-per-bucket", action="store_true", help="also time one eager forward per bucket")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, OMP_WAIT_POLICY="
        f"{os.environ['OMP_WAIT_POLICY']}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    rows = [measure(name, args.forward_per_bucket) for name in args.shapes.split(",") + args.model if name]
    header = [
        "model",
        "buckets decode + prefill",
        "load s",
        "capture s (decode, prefill)",
        "all graphs live s",
        "first token s",
    ] + (["one forward per bucket s"] if args.forward_per_bucket else [])
    table = []
    for r in rows:
        pending = ", capture still running" if r["capture_pending_at_first_token"] else ""
        row = [
            r["model"],
            f"{r['decode_buckets']} + {r['prefill_buckets']}",
            f"{r['load_s']:.2f} [{r['load_cpu_s']:.2f}]",
            f"{r['capture_s']:.2f} [{r['capture_cpu_s']:.2f}] ({r['decode_capture_s']:.2f}, "
            f"{r['prefill_capture_s']:.2f})",
            f"{r['all_live_s']:.2f} [{r['all_live_cpu_s']:.2f}]",
            f"{r['first_token_s']:.2f} [{r['first_token_cpu_s']:.2f}]{pending}",
        ]
        if args.forward_per_bucket:
            row.append(f"{r['forward_per_bucket_s']:.1f}")
        table.append(row)
    print(md_table(header, table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
