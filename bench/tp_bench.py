"""Tensor parallel on two GPUs: ``--tp 2`` against ``--tp 1`` on Llama-3.1-8B shape (random bf16 weights,
saved to disk once so that each rank loads its slices), measured side by side in one run.

    python bench/tp_bench.py --out OUT_DIR [--ckpt /tmp/graphtop-llama-3.1-8b-random] [--rounds 5]
        [--steps 40] [--bs 1,64] [--nccl]
    python bench/tp_bench.py --device cpu --small --ckpt /tmp/tp-small   # a dry run of this script on CPU

Both engines live in this process at once (tp 1 on cuda:0; tp 2's rank 0 on cuda:0 and its worker on
cuda:1) and decode the same kind of batch in interleaved rounds (tp 1, tp 2, tp 1, ...), so context
growth and clock drift hit both alike; figures are medians of whole serving steps (schedule, forward,
sample, events; the overlap schedule on, as in serving). Targets (issue 18): at batch 1 the tp 2 step
takes <= 0.65x the tp 1 step; at batch 64 tp 2 makes >= 1.6x the tokens/s. ``--nccl`` adds a second
pass with tp 2's all-reduce forced to NCCL (after the first tp 2 engine is closed: one process holds one
group at a time), to show what the symmetric-memory one-shot all-reduce is worth.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402

from graphtop.engine.config import EngineConfig  # noqa: E402
from graphtop.engine.engine import Engine  # noqa: E402
from graphtop.engine.graphs.config import GraphConfig  # noqa: E402
from graphtop.engine.kernel_config import KernelConfig  # noqa: E402
from graphtop.models.synthetic.random_model import save_random_checkpoint  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from events_bench import timed  # noqa: E402
from graph_bench import MAX_CONTEXT, PROMPT_LEN, drain, fill_decode  # noqa: E402  (prompt 128, context 1088)
BS1_TARGET = 0.65  # tp 2 step / tp 1 step at batch 1, at most
BS64_TARGET = 1.6  # tp 2 tokens/s / tp 1 tokens/s at batch 64, at least


def log(*a: Any) -> None:
    print(*a, flush=True)


SMALL = dict(num_hidden_layers=2, hidden_size=256, intermediate_size=512, num_attention_heads=8, num_key_value_heads=4,
             head_dim=32, vocab_size=1000)
"""``--small``: the same family at a size a CPU runs in seconds (to check this script, not to measure)."""


def make_engine(path: Path, tp: int, batch_sizes: list[int], device: str, all_reduce: str = "auto") -> Engine:
    g = GraphConfig()
    g.set("decode.bs", sorted(set(batch_sizes)))
    g.set("prefill.backend", "disabled")  # decode is what is measured; quicker capture
    cfg = EngineConfig(device=device, dtype="bfloat16", tp_size=tp, max_context_len=MAX_CONTEXT,
                       max_running_requests=max(batch_sizes), chunked_prefill_size=2048,
                       max_total_tokens=max(batch_sizes) * MAX_CONTEXT + 4096, graphs=g,
                       kernels=KernelConfig(all_reduce=all_reduce))
    return Engine.from_pretrained(path, config=cfg)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_steps(eng: Engine, n: int) -> float:
    return timed(eng, n, sync)


def side_by_side(engines: dict[str, Engine], bs: int, rounds: int, steps: int) -> dict[str, dict[str, Any]]:
    """Decode step ms of each engine at ``bs``, in interleaved rounds; medians and every round."""
    handles = {name: fill_decode(eng, bs, seed=bs) for name, eng in engines.items()}
    for eng in engines.values():
        time_steps(eng, 5)  # warm: the overlap schedule in its steady state
    rounds_ms: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(rounds):
        for name, eng in engines.items():
            rounds_ms[name].append(time_steps(eng, steps))
    out = {}
    for name, eng in engines.items():
        ms = statistics.median(rounds_ms[name])
        decode = eng.model_runner.decode
        out[name] = {"step_ms": ms, "tok_s": bs / ms * 1e3, "rounds_ms": rounds_ms[name],
                     "graph": decode is not None and decode.policy.pick(bs) is not None}
        drain(eng, handles[name])
    return out


def compare(tp1: Engine, tp2: Engine, label: str, batch_sizes: list[int], rounds: int, steps: int) -> dict[str, Any]:
    result: dict[str, Any] = {"all_reduce": tp2.tp.comm.note}
    log(f"\n== {label}: tp 2 all-reduce: {tp2.tp.comm.note}")
    log(f"{'bs':>4}  {'tp1 ms':>8}  {'tp2 ms':>8}  {'tp1 tok/s':>10}  {'tp2 tok/s':>10}  {'step ratio':>10}  "
        f"{'tok/s ratio':>11}  target")
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
        log(f"{bs:>4}  {r['tp1']['step_ms']:>8.3f}  {r['tp2']['step_ms']:>8.3f}  {r['tp1']['tok_s']:>10.0f}  "
            f"{r['tp2']['tok_s']:>10.0f}  {step_ratio:>10.3f}  {tok_ratio:>11.3f}  {target} {verdict}")
        if not (r["tp1"]["graph"] and r["tp2"]["graph"]):
            log(f"      note: a decode graph did not take bs {bs} (tp1 {r['tp1']['graph']}, tp2 {r['tp2']['graph']})")
        result[str(bs)] = {**r, "step_ratio": step_ratio, "tok_s_ratio": tok_ratio, "target": target, "met": ok}
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tp-bench-out")
    ap.add_argument("--ckpt", default="/tmp/graphtop-llama-3.1-8b-random", help="random checkpoint folder (made once)")
    ap.add_argument("--bs", default="1,64")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--nccl", action="store_true", help="also measure tp 2 with its all-reduce forced to NCCL")
    ap.add_argument("--device", default="cuda", help="cuda (the measurement) or cpu (a dry run with --small)")
    ap.add_argument("--small", action="store_true", help="a small model of the same family (dry runs)")
    args = ap.parse_args()
    if args.device == "cuda" and torch.cuda.device_count() < 2:
        log("tp_bench: skipped (needs 2 CUDA devices)")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    batch_sizes = [int(b) for b in args.bs.split(",")]
    t = time.perf_counter()
    path = save_random_checkpoint("llama-3.1-8b", args.ckpt, dtype=torch.bfloat16,
                                  device="cuda:0" if args.device == "cuda" else "cpu", **(SMALL if args.small else {}))
    log(f"checkpoint {path} ready in {time.perf_counter() - t:.1f} s")
    devices = [torch.cuda.get_device_name(i) for i in range(2)] if args.device == "cuda" else ["cpu"]
    report: dict[str, Any] = {"shape": "llama-3.1-8b" + (" (small)" if args.small else ""), "dtype": "bfloat16",
                              "prompt_len": PROMPT_LEN, "rounds": args.rounds, "steps": args.steps, "devices": devices}
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
    (out / "tp_bench.json").write_text(json.dumps(report, indent=1))
    log(f"\nwrote {out / 'tp_bench.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
