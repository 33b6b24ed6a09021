"""OpenMP wait policy on a small CPU: graphtop's bs-1 decode with torch at 1 and 2 threads, alone and
beside a UI-like Python thread (the dashboard's), under OpenMP's default wait policy (idle threads
spin a while before they sleep) and OMP_WAIT_POLICY=PASSIVE (what the graphtop command sets). The policy is read when torch loads OpenMP, so
each policy runs in its own child process; inside a child, thread counts and neighbour on/off
alternate over rounds. Figures are medians.

    python3 bench/omp_spin.py [--model DIR|FILE.gguf] [--rounds 3] [--new-tokens 24]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def child(args: argparse.Namespace) -> dict:
    import torch

    sys.path.insert(0, str(HERE))
    from cpu_bench import build_engine, checkpoint_folder, default_model, graphtop_rate, prompts_for

    engine = build_engine(checkpoint_folder(args.model or default_model()), "eager", 1)
    prompt = prompts_for(engine.tokenizer, 1)
    stop = threading.Event()

    def ui_like() -> None:  # ~30 % of a core in pure Python, in short bursts, like a 15 Hz redraw
        while not stop.is_set():
            t = time.perf_counter()
            while time.perf_counter() - t < 0.02:
                pass
            time.sleep(0.045)

    rates: dict[str, list[float]] = {}
    graphtop_rate(engine, prompt, 8)  # warm-up
    for _ in range(args.rounds):
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for neighbour in (False, True):
                stop.clear()
                t = threading.Thread(target=ui_like, daemon=True)
                if neighbour:
                    t.start()
                rate = graphtop_rate(engine, prompt, args.new_tokens).wall
                stop.set()
                if neighbour:
                    t.join()
                key = f"{threads} thread{'s' if threads > 1 else ''}, {'with' if neighbour else 'without'} UI thread"
                rates.setdefault(key, []).append(rate)
    return {k: statistics.median(v) for k, v in rates.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return 0
    results = {}
    for policy in ("default", "PASSIVE"):
        cmd = [sys.executable, __file__, "--child", "--rounds", str(args.rounds), "--new-tokens", str(args.new_tokens)]
        if args.model:
            cmd += ["--model", args.model]
        env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
        if policy != "default":
            env["OMP_WAIT_POLICY"] = policy
        out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
        results[policy] = json.loads(out.strip().splitlines()[-1])
    print(f"graphtop bs-1 decode tok/s (wall, median of {args.rounds}), load average {os.getloadavg()[0]:.1f}")
    for key in results["default"]:
        a, p = results["default"][key], results["PASSIVE"][key]
        print(f"  {key:34s} default {a:6.1f}   PASSIVE {p:6.1f}   PASSIVE/default {p / a:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
