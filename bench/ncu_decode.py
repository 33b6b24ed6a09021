"""Launches for Nsight Compute: the kernels inside an NVTX range named ``ncu`` are the ones to profile
(``ncu --nvtx --nvtx-include "ncu/" ...``; scripts/ncu_check.sh runs the usual reports).

    python3 bench/ncu_decode.py attn --shape llama-3.1-8b --cases 64:220:engine,64:220:shuffled
        one decode-attention launch per case (rows:context:slot layout, bench/decode_attn_bench.py's
        caches), the shipped launch shape of that many rows, in the order given
    python3 bench/ncu_decode.py step --shape llama-3.1-8b --bs 64 [--steps 2] [--eager]
        whole decode steps of a live engine (random weights, prompt 128), graphs replayed unless --eager

Why: timing alone says how long a kernel takes, not whether it waits on DRAM, on latency or on its
issue slots; the hardware counters say which, per kernel, with the step's real launch shapes.
"""

from __future__ import annotations

import argparse
import sys

import torch
from decode_attn_bench import SHAPES, Case, triton_layer
from harness import fill_decode, log, make_engine, random_ckpt, time_steps

RANGE = "ncu"


def attn(args: argparse.Namespace) -> None:
    for spec in args.cases.split(","):
        bs, ctx, layout = spec.split(":")
        case = Case(SHAPES[args.shape], int(bs), int(ctx), layout=layout)
        layer = triton_layer(case)
        for i in range(case.layers):  # compile and warm up outside the range
            layer(i)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push(RANGE)
        layer(0)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        log(f"profiled: attention {args.shape} rows {bs} context {ctx} slots {layout}")
        del case, layer
        torch.cuda.empty_cache()


def step(args: argparse.Namespace) -> None:
    ckpt = random_ckpt(args.shape)
    eng = make_engine(
        ckpt,
        "flashinfer",
        graphs=not args.eager,
        max_running=max(64, args.bs),
        decode_bs=[args.bs],
        prefill_graphs=False,
    )
    fill_decode(eng, args.bs)
    time_steps(eng, 10)
    torch.cuda.nvtx.range_push(RANGE)
    for _ in range(args.steps):
        eng.step()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    log(
        f"profiled: {args.steps} decode steps of {args.shape} at {args.bs} rows "
        f"({'eager' if args.eager else 'graphs'}; {eng.attention.describe()})"
    )
    eng.close()


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    a = sub.add_parser("attn")
    a.add_argument("--shape", default="llama-3.1-8b")
    a.add_argument("--cases", default="64:220:engine")
    s = sub.add_parser("step")
    s.add_argument("--shape", default="llama-3.1-8b")
    s.add_argument("--bs", type=int, default=64)
    s.add_argument("--steps", type=int, default=2)
    s.add_argument("--eager", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device")
    (attn if args.what == "attn" else step)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
