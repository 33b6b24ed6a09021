"""Tensor parallel on two GPUs: ``--tp 2`` against ``--tp 1`` on Llama-3.1-8B shape (random bf16 weights,
saved to disk once so that each rank loads its slices), measured side by side in one run.

    python3 bench/tp_bench.py --out OUT_DIR [--ckpt DIR] [--rounds 5] [--steps 40] [--bs 1,64] [--nccl]
    python3 bench/tp_bench.py --device cpu --small --ckpt DIR   # a dry run of this script on CPU

Both engines live in this process at once (tp 1 on cuda:0; tp 2's rank 0 on cuda:0 and its worker on
cuda:1) and decode the same kind of batch in interleaved rounds (tp 1, tp 2, tp 1, ...), so context
growth and clock drift hit both alike; figures are medians of whole serving steps (schedule, forward,
sample, events; the overlap schedule on, as in serving). Targets: at batch 1 the tp 2 step
takes <= 0.65x the tp 1 step; at batch 64 tp 2 makes >= 1.6x the tokens/s. ``--nccl`` adds a second
pass with tp 2's all-reduce forced to NCCL (after the first tp 2 engine is closed: one process holds one
group at a time), to show what the symmetric-memory one-shot all-reduce is worth.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from harness import (
    CPU_SHAPE,
    MAX_CONTEXT,
    PROMPT_LEN,
    comma_ints,
    drain,
    engine_config,
    fill_decode,
    interleaved,
    log,
    time_steps,
    write_json,
)

from graphtop.engine.engine import Engine
from graphtop.engine.kernel_config import KernelConfig
from graphtop.models.synthetic.random_model import save_random_checkpoint

BS1_TARGET = 0.65  # tp 2 step / tp 1 step at batch 1, at most
BS64_TARGET = 1.6  # tp 2 tokens/s / tp 1 tokens/s at batch 64, at least
DEFAULT_CKPT = Path(tempfile.gettempdir()) / "graphtop-llama-3.1-8b-random"


def make_engine(path: Path, tp: int, batch_sizes: list[int], device: str, all_reduce: str = "auto") -> Engine:
    """A ``tp``-rank engine loaded from the checkpoint folder (each rank reads its slices), decode graphs at
    the measured batch sizes only."""
    cfg = engine_config(
        device=device,
        tp_size=tp,
        max_running=max(batch_sizes),
        decode_bs=sorted(set(batch_sizes)),
        prefill_graphs=False,
        longest_context=MAX_CONTEXT,
        chunked_prefill_size=2048,
        dtype="bfloat16",
        kernels=KernelConfig(all_reduce=all_reduce),
    )
    return Engine.from_pretrained(path, config=cfg)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def side_by_side(engines: dict[str, Engine], bs: int, rounds: int, steps: int) -> dict[str, dict[str, Any]]:
    """Decode step ms of each engine at ``bs``, in interleaved rounds; medians and every round."""
    handles = {name: fill_decode(eng, bs, seed=bs) for name, eng in engines.items()}
    for eng in engines.values():
        time_steps(eng, 5, sync)  # warm: the overlap schedule in its steady state
    rounds_ms = interleaved({name: (lambda e=eng: time_steps(e, steps, sync)) for name, eng in engines.items()}, rounds)
    out = {}
    for name, eng in engines.items():
        ms = statistics.median(rounds_ms[name])
        decode = eng.model_runner.decode
        out[name] = {
            "step_ms": ms,
            "tok_s": bs / ms * 1e3,
            "rounds_ms": rounds_ms[name],
            "graph": decode is not None and decode.policy.pick(bs) is not None,
        }
        drain(eng, handles[name])
    return out


def compare(tp1: Engine, tp2: Engine, label: str, batch_sizes: list[int], rounds: int, steps: int) -> dict[str, Any]:
    result: dict[str, Any] = {"all_reduce": tp2.tp.comm.note}
    log(f"\n== {label}: tp 2 all-reduce: {tp2.tp.comm.note}")
    log(
        f"{'bs':>4}  {'tp1 ms':>8}  {'tp2 ms':>8}  {'tp1 tok/s':>10}  {'tp2 tok/s':>10}  {'step ratio':>10}  "
        f"{'tok/s ratio':>11}  target"
    )
    for bs in batch_sizes:
        r = side_by_side({"tp1": tp1, "tp2": tp2}, bs, rounds, steps)
        step_ratio = r["tp2"]["step_ms"] / r["tp1"]["step_ms"]
        tok_ratio = r["tp2"]["tok_s"] / r["tp1"]["tok_s"]
        if bs == 1:
            target, ok = f"step <= {BS1_TARGET}x", step_ratio <= BS1_TARGET
        elif bs == 64:
            target, ok = f"tok/s >= {BS64_TARGET}x", tok_ratio >= BS64_TARGET
        else:
            target, ok = "-", None
        verdict = "" if ok is None else ("MET" if ok else "MISSED")
        log(
            f"{bs:>4}  {r['tp1']['step_ms']:>8.3f}  {r['tp2']['step_ms']:>8.3f}  {r['tp1']['tok_s']:>10.0f}  "
            f"{r['tp2']['tok_s']:>10.0f}  {step_ratio:>10.3f}  {tok_ratio:>11.3f}  {target} {verdict}"
        )
        if not (r["tp1"]["graph"] and r["tp2"]["graph"]):
            log(f"      note: a decode graph did not take bs {bs} (tp1 {r['tp1']['graph']}, tp2 {r['tp2']['graph']})")
        result[str(bs)] = {**r, "step_ratio": step_ratio, "tok_s_ratio": tok_ratio, "target": target, "met": ok}
    return result


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tp-bench-out")
    ap.add_argument(
        "--ckpt",
        default=str(DEFAULT_CKPT),
        help="random checkpoint folder (made once; default: graphtop-llama-3.1-8b-random in the temp folder)",
    )
    ap.add_argument("--bs", default="1,64")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--nccl", action="store_true", help="also measure tp 2 with its all-reduce forced to NCCL")
    ap.add_argument("--device", default="cuda", help="cuda (the measurement) or cpu (a dry run with --small)")
    ap.add_argument("--small", action="store_true", help="a small model of the same family (dry runs)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.device == "cuda" and torch.cuda.device_count() < 2:
        log("tp_bench: skipped (needs 2 CUDA devices)")
        return 0
    batch_sizes = comma_ints(args.bs)
    t = time.perf_counter()
    path = save_random_checkpoint(
        "llama-3.1-8b",
        args.ckpt,
        dtype=torch.bfloat16,
        device="cuda:0" if args.device == "cuda" else "cpu",
        **(CPU_SHAPE if args.small else {}),
    )
    log(f"checkpoint {path} ready in {time.perf_counter() - t:.1f} s")
    devices = [torch.cuda.get_device_name(i) for i in range(2)] if args.device == "cuda" else ["cpu"]
    report: dict[str, Any] = {
        "shape": "llama-3.1-8b" + (" (small)" if args.small else ""),
        "dtype": "bfloat16",
        "prompt_len": PROMPT_LEN,
        "rounds": args.rounds,
        "steps": args.steps,
        "devices": devices,
    }
    t = time.perf_counter()
    tp1 = make_engine(path, 1, batch_sizes, args.device)
    log(f"tp 1 engine ready in {time.perf_counter() - t:.1f} s")
    try:
        passes = [("default", "auto")] + ([("nccl", "nccl")] if args.nccl else [])
        for label, all_reduce in passes:
            t = time.perf_counter()
            tp2 = make_engine(path, 2, batch_sizes, args.device, all_reduce)
            log(f"tp 2 engine ({label}) ready in {time.perf_counter() - t:.1f} s")
            try:
                report[label] = compare(tp1, tp2, label, batch_sizes, args.rounds, args.steps)
            finally:
                tp2.close()
    finally:
        tp1.close()
    log(f"\nwrote {write_json(args.out, 'tp_bench.json', report)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
