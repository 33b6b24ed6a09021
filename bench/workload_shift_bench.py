"""Workload shift: the same recorded mix served with the default bucket lists, with offline advice from
its first half, and with auto-tune.

The mix shifts midway from short prompts (chat turns) to long ones (documents): lists advised once on
the first half go stale, and the defaults fit neither half. Each request arrives every other step and
decodes a fixed number of greedy tokens, so the schedule is the same in every run. Three runs:

* ``default``: fixed lists, the kind set by hand once (``--decode-bs``, ``--prefill-tokens``; by default
  1,2,4,8 and 64,256,1024);
* ``offline``: the lists ``graphtop advise`` would give for a trace of the first half (served with the
  defaults), from the start;
* ``auto-tune``: the defaults, with ``engine.auto_tune.AutoTuner`` ticked once per step on a step clock
  (re-advise every ``--every`` steps, at most one recapture per ``--min-interval`` steps).

The figure is the advisor's step cost, summed over every step served (``bucket_advisor``'s model: a graph
step costs its bucket, an eager one R x its size, R the default eager ratio on emulated graphs), in rows
and tokens, beside the ideal (every step a graph of its exact size). Steps that run eagerly while a
recapture captures count as eager: auto-tune pays for its recaptures. The run also checks that every
run gave the same greedy tokens. On CUDA the wall time of the serving loop is reported too.

    python bench/workload_shift_bench.py                      # CPU, emulated graphs
    python bench/workload_shift_bench.py --device cuda --shape qwen3-0.6b
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Optional

import numpy as np
from harness import comma_ints, engine_config, log, md_table, shape_ckpt

from graphtop.engine.auto_tune import AutoTuneConfig, AutoTuner
from graphtop.engine.engine import Engine
from graphtop.engine.graphs.bucket_demand import DEFAULT_EAGER_RATIO, advise_phase
from graphtop.engine.sampling_params import SamplingParams
from graphtop.engine.telemetry.bus import EventBus
from graphtop.engine.telemetry.events import RecaptureRequested, StepEvent
from graphtop.engine.telemetry.step_size import step_key, step_phase


class StepClock:
    """Auto-tune's clock: one unit per engine step, so its schedule does not depend on the machine."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def workload(n: int, seed: int) -> list[int]:
    """Prompt lengths: the first half short (8-64 tokens), the second long (256-896)."""
    rng = np.random.default_rng(seed)
    short = rng.integers(8, 65, n // 2)
    long = rng.integers(256, 897, n - n // 2)
    return [int(x) for x in np.concatenate([short, long])]


def serve(eng: Engine, lengths: list[int], new_tokens: int, tuner: Optional[AutoTuner] = None) -> list[list[int]]:
    vocab = eng.spec.vocab_size
    clock = tuner.clock if tuner is not None else None
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True, detokenize=False)
    handles = []

    def step() -> bool:
        stepped = eng.step()
        if tuner is not None:
            clock.t += 1.0  # type: ignore[union-attr]
            tuner.tick()
        return stepped

    for i, n in enumerate(lengths):
        handles.append(eng.submit([10 + (i * 31 + j * 7) % (vocab - 20) for j in range(n)], params))
        step()
        step()
    while step():
        pass
    return [h.token_ids for h in handles]


def step_cost(steps: list[StepEvent]) -> dict[str, float]:
    """The advisor's cost of the steps served, per phase, and the ideal."""
    out = {"decode": 0.0, "prefill": 0.0, "ideal": 0.0}
    for s in steps:
        phase = step_phase(s.phase)
        size = step_key(s.phase, s.batch_size, s.num_tokens)
        if size <= 0:
            continue
        graph = s.path == "graph" and s.bucket
        out[phase] += float(s.bucket) if graph else DEFAULT_EAGER_RATIO[phase] * size  # type: ignore[arg-type]
        out["ideal"] += size
    return out


def run(args: Any, ckpt: Any, lengths: list[int], lists: Optional[dict[str, list[int]]], tune: bool) -> dict[str, Any]:
    bus = EventBus()
    sub = bus.subscribe("bench", maxsize=1_000_000)
    config = engine_config(
        device=args.device,
        max_running=args.max_running,
        max_context=1024 + args.new_tokens + 8,
        longest_context=1024,
        chunked_prefill_size=1024,
    )
    lists = lists if lists is not None else {"decode": args.decode_bs, "prefill": args.prefill_tokens}
    if lists["decode"]:
        config.graphs.set("decode.bs", lists["decode"])
    if lists["prefill"]:
        config.graphs.set("prefill.num_tokens", lists["prefill"])
    eng = Engine(ckpt, config, bus)
    tuner = None
    if tune:
        cfg = AutoTuneConfig(
            every_s=args.every, min_interval_s=args.min_interval, threshold=args.threshold, min_steps=16, window=1024
        )
        tuner = AutoTuner(eng, cfg, clock=StepClock())
    lists_used = {"decode": eng.decode_buckets, "prefill": eng.prefill_buckets}
    t0 = time.perf_counter()
    tokens = serve(eng, lengths, args.new_tokens, tuner)
    wall = time.perf_counter() - t0
    final = {"decode": eng.decode_buckets, "prefill": eng.prefill_buckets}
    if tuner is not None:
        tuner.close()
    eng.close()
    events = sub.drain()
    steps = [e for e in events if isinstance(e, StepEvent)]
    recaptures = sum(1 for e in events if isinstance(e, RecaptureRequested))
    return dict(
        tokens=tokens,
        steps=steps,
        cost=step_cost(steps),
        wall_s=wall,
        recaptures=recaptures,
        lists=lists_used,
        final=final,
    )


def offline_advice(first_half: list[StepEvent], defaults: dict[str, list[int]]) -> dict[str, list[int]]:
    """What ``graphtop advise`` gives for a trace of the first half: each phase at its graph count."""
    out = {}
    for phase in ("decode", "prefill"):
        advice, _ = advise_phase(
            first_half,
            phase,
            current=defaults[phase],
            max_graphs=len(defaults[phase]),
            max_padding_waste=None,
        )
        out[phase] = list(advice.buckets) or defaults[phase]
    return out


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--shape", default="tiny", help="tiny (CPU-sized) or a published shape, e.g. qwen3-0.6b")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--max-running", type=int, default=16)
    ap.add_argument("--every", type=float, default=32.0, help="auto-tune re-advises every N steps")
    ap.add_argument("--min-interval", type=float, default=128.0, help="at most one recapture per N steps")
    ap.add_argument("--threshold", type=float, default=0.05)
    ap.add_argument(
        "--decode-bs", type=comma_ints, default=[1, 2, 4, 8], help="the fixed decode list (empty: the engine's default)"
    )
    ap.add_argument(
        "--prefill-tokens",
        type=comma_ints,
        default=[64, 256, 1024],
        help="the fixed prefill list (empty: the engine's default, dense up to the chunk size)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="PATH", help="write the figures as JSON")

    return ap


def main(argv: Optional[list[str]] = None) -> None:
    args = parser().parse_args(argv)
    ckpt = shape_ckpt(args.shape, args.device)
    lengths = workload(args.requests, args.seed)
    log("default lists ...")
    default = run(args, ckpt, lengths, None, tune=False)
    log("first half, then offline advice ...")
    half = run(args, ckpt, lengths[: len(lengths) // 2], None, tune=False)
    advised = offline_advice(half["steps"], default["lists"])
    offline = run(args, ckpt, lengths, advised, tune=False)
    log("auto-tune ...")
    tuned = run(args, ckpt, lengths, None, tune=True)
    results = {"default": default, "offline": offline, "auto-tune": tuned}
    same = all(r["tokens"] == default["tokens"] for r in results.values())

    base = sum(default["cost"][p] for p in ("decode", "prefill"))
    rows = []
    for name, r in results.items():
        c = r["cost"]
        total = c["decode"] + c["prefill"]
        rows.append(
            [
                name,
                f"{c['decode']:,.0f}",
                f"{c['prefill']:,.0f}",
                f"{total:,.0f}",
                f"{total / c['ideal']:.3f}×",
                f"{100 * (total / base - 1):+.1f} %",
                str(r["recaptures"]),
                f"{r['wall_s']:.2f}",
            ]
        )
    print(
        md_table(
            ["lists", "decode cost", "prefill cost", "total", "÷ ideal", "vs default", "recaptures", "wall s"], rows
        )
    )
    print(f"\ngreedy tokens equal in every run: {same}")
    for name, r in results.items():
        print(f"{name}: started {r['lists']}, ended {r['final']}")
    if args.json:
        keep = {k: {kk: v for kk, v in r.items() if kk not in ("tokens", "steps")} for k, r in results.items()}
        with open(args.json, "w") as f:
            json.dump(dict(results=keep, same_tokens=same, args=vars(args)), f, indent=2)
    if not same:
        raise SystemExit("the runs gave different greedy tokens")


if __name__ == "__main__":
    main()
