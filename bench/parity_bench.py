"""Decode throughput with online parity checks (``--parity-every N``) against without, side by side.

For each batch size two engines share one random-weight checkpoint: one with parity checks every N
graph steps, one without. Both serve the same ``bs`` requests; timing rounds of ``--steps`` decode
steps alternate between them (the order flips every round), so clock drift and context growth hit
both alike. Prints the median decode tokens/s of each and the ratio with ÷ without (the target on the
H200 is >= 0.97 at N = 64), and what the checks found (run, skipped, mismatches, worst relative error).

    python3 bench/parity_bench.py --device cuda [--shape qwen3-0.6b] [--batch-sizes 1,64] [--every 64]
        [--rounds 8] [--steps 256] [--attention auto] [--compare-pacing]
    python3 bench/parity_bench.py --device cpu   # smoke check: a CPU-sized Qwen3, emulated graphs
"""

from __future__ import annotations

import argparse
import gc
import sys
from typing import Any

import torch
from harness import (
    CPU_SHAPE,
    PROMPT_LEN,
    comma_ints,
    fill_decode,
    interleaved,
    log,
    make_engine,
    medians,
    random_ckpt,
    release_cuda,
    sync_for,
    time_steps,
)


def tokens_per_s(eng: Any, bs: int, steps: int, device: str) -> float:
    return bs * steps / time_steps(eng, steps, sync_for(device)) * 1e3


def run_batch_size(ckpt: Any, args: argparse.Namespace, bs: int) -> dict[str, float]:
    new_tokens = (args.rounds + 1) * args.steps + 8
    context = PROMPT_LEN + new_tokens + 16

    def engine(every: int) -> Any:
        return make_engine(
            ckpt,
            args.attention,
            device=args.device,
            max_running=bs,
            max_context=context,
            longest_context=context,
            parity_every=every,
        )

    engines = {"without": engine(0), "with": engine(args.every)}
    if args.compare_pacing:  # the same checks with the re-run's pacing off (engine/parity/checker.py)
        engines["unpaced"] = engine(args.every)
        engines["unpaced"].parity.pacing = False
    handles = {name: fill_decode(eng, bs, seed=bs, max_new_tokens=new_tokens) for name, eng in engines.items()}
    for eng in engines.values():  # warm up, checks included (the first eager re-run compiles its kernels)
        tokens_per_s(eng, bs, args.steps, args.device)
    checkers = {name: eng.parity for name, eng in engines.items() if name != "without"}
    before = {}
    for name, checker in checkers.items():
        checker.wait_idle()
        before[name] = (checker.checks, checker.skipped)
    rates = interleaved(
        {name: (lambda e=eng: tokens_per_s(e, bs, args.steps, args.device)) for name, eng in engines.items()},
        args.rounds,
        abba=True,
    )
    out = medians(rates)
    result: dict[str, float] = {"bs": bs, "without_tok_s": out["without"]}
    for name, checker in checkers.items():
        checker.wait_idle()
        checks, skipped = checker.checks - before[name][0], checker.skipped - before[name][1]
        ratio = out[name] / out["without"]
        label = f"with (1 in {args.every})" if name == "with" else f"{name} (1 in {args.every})"
        print(
            f"bs {bs:>3}: without {out['without']:10.1f} tok/s   {label} {out[name]:10.1f} tok/s"
            f"   {name} ÷ without {ratio:.3f}   (medians of {args.rounds} rounds × {args.steps} steps;"
            f" rounds {min(rates[name]) / max(rates['without']):.3f}–{max(rates[name]) / min(rates['without']):.3f})",
            flush=True,
        )
        print(
            f"        checks run {checks}, skipped {skipped} (one still running), mismatches {checker.mismatches},"
            f" worst rel err {checker.worst_rel_err:.3g} (tolerance {checker.tolerance:g})",
            flush=True,
        )
        result[f"{name}_tok_s"], result[f"{name}_ratio"] = out[name], ratio
        if name == "with":
            result.update(with_tok_s=out[name], ratio=ratio, checks=checks, skipped=skipped)
    for name, eng in engines.items():
        for h in handles[name]:
            eng.cancel(h.request_id)
        eng.run_until_idle()
        eng.close()
    del engines, handles
    gc.collect()
    release_cuda()
    return result


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shape", default="qwen3-0.6b")
    ap.add_argument("--batch-sizes", default=None, help="default 1,64 (CUDA) or 1,8 (CPU)")
    ap.add_argument("--every", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=None, help="default 8 (CUDA) or 3 (CPU)")
    ap.add_argument("--steps", type=int, default=None, help="steps per timing round; default 256 (CUDA) or 64 (CPU)")
    ap.add_argument("--attention", default="auto", choices=["auto", "flashinfer", "torch"])
    ap.add_argument(
        "--compare-pacing",
        action="store_true",
        help="also time an engine whose parity re-run is not paced (its Python competes freely)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    cuda = args.device == "cuda"
    args.rounds = args.rounds or (8 if cuda else 3)
    args.steps = args.steps or (256 if cuda else 64)
    sizes = comma_ints(args.batch_sizes or ("1,64" if cuda else "1,8"))
    if cuda and not torch.cuda.is_available():
        ap.error("--device cuda needs a CUDA device (--device cpu is a smoke check)")
    if cuda:
        ckpt = random_ckpt(args.shape)
        log(f"{torch.cuda.get_device_name()} · {args.shape} (random bf16 weights) · attention {args.attention}")
    else:
        torch.set_num_threads(1)
        ckpt = random_ckpt(args.shape, device="cpu", dtype=torch.float32, **CPU_SHAPE)
        print(
            f"cpu · {args.shape} CPU-sized, emulated graphs: a smoke check, not a throughput figure (the eager"
            " re-run competes with the engine for the same cores)",
            flush=True,
        )
    results = [run_batch_size(ckpt, args, bs) for bs in sizes]
    worst = min(r["ratio"] for r in results)
    print(f"lowest with ÷ without: {worst:.3f}" + (" (target >= 0.97)" if cuda else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
