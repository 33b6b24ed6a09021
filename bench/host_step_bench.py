"""Host time of a decode step at many running requests, without the model: what the step loop's
Python costs per step (scheduling, building the batch, delivering the tokens to the handles), which
the overlap schedule must hide behind the GPU's step.

Why: at a few hundred requests the per-request Python of a step adds up to milliseconds, as long as
a small model's whole GPU step. Measured on the CPU without a forward, so it runs anywhere; thread
CPU time, the minimum of several repetitions (a shared machine's noise only ever adds).

    python3 bench/host_step_bench.py [--bs 64,256] [--reps 7] [--steps 50]

Prints, per batch size, the scheduler's decode step plus the output processor's delivery of its
tokens: the part of a step's host work that is the same on every device (the runner's part depends on
the attention backend: FlashInfer's planning does not run here).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Callable

import torch
from harness import PROMPT_LEN, TINY_SHAPE, comma_ints, fill_decode, log, make_engine, random_ckpt

NEW_TOKENS = 1064  # room for the timed steps (refused past it), so the batch stays whole


def engine(bs: int) -> Any:
    """``bs`` requests past their prefill on a tiny model whose forward returns zeros."""
    ckpt = random_ckpt("qwen3-0.6b", device="cpu", dtype=torch.float32, **TINY_SHAPE)
    hidden = TINY_SHAPE["hidden_size"]
    ckpt.model.forward = lambda input_ids, positions, attn: torch.zeros(input_ids.shape[0], hidden)
    eng = make_engine(
        ckpt,
        "torch",
        device="cpu",
        max_running=bs,
        decode_bs=[bs],
        prefill_graphs=False,
        max_context=4096,
        longest_context=PROMPT_LEN + NEW_TOKENS,
        chunked_prefill_size=8192,
    )
    fill_decode(eng, bs, max_new_tokens=NEW_TOKENS)
    return eng


def best_ms(fn: Callable[[], Any], steps: int, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.thread_time()
        for _ in range(steps):
            fn()
        times.append((time.thread_time() - t) / steps * 1e3)
    return min(times)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bs", default="64,256")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--steps", type=int, default=50)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.steps * args.reps >= NEW_TOKENS:
        ap.error(f"{args.reps} repetitions of {args.steps} steps outgrow the requests' {NEW_TOKENS} tokens")
    torch.set_num_threads(1)
    for bs in comma_ints(args.bs):
        eng = engine(bs)
        tokens = [7] * bs

        def schedule_and_deliver() -> None:
            batch = eng.scheduler.schedule()
            eng.output.deliver(batch, tokens)

        sd = best_ms(schedule_and_deliver, args.steps, args.reps)
        log(f"bs {bs}: schedule + deliver {sd:.3f} ms a decode step (host CPU time)")
        eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
