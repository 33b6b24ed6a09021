"""Launches for Nsight Compute: the kernels inside an NVTX range named ``ncu`` are the ones to profile
(``ncu --nvtx --nvtx-include "ncu/" ...``; scripts/ncu_check.sh runs the usual reports).

    python bench/ncu_decode.py attn --shape llama-3.1-8b --cases 64:220:engine,64:220:shuffled
        one decode-attention launch per case (rows:context:slot layout, bench/decode_attn_bench.py's
        caches), the shipped launch shape of that many rows, in the order given
    python bench/ncu_decode.py step --shape llama-3.1-8b --bs 64 [--steps 2] [--eager]
        whole decode steps of a live engine (random weights, prompt 128), graphs replayed unless --eager

Why: timing alone says how long a kernel takes, not whether it waits on DRAM, on latency or on its
issue slots; the hardware counters say which, per kernel, with the step's real launch shapes.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

RANGE = "ncu"


def attn(args: argparse.Namespace) -> None:
    from decode_attn_bench import SHAPES, Case, triton_layer

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
        print(f"profiled: attention {args.shape} rows {bs} context {ctx} slots {layout}", flush=True)
        del case, layer
        torch.cuda.empty_cache()


def step(args: argparse.Namespace) -> None:
    from graph_bench import fill_decode, make_engine, time_steps

    from graphtop.models.synthetic.random_model import hf_config_for, random_checkpoint

    ckpt = random_checkpoint(hf_config_for(args.shape), device="cuda", dtype=torch.bfloat16)
    eng = make_engine(ckpt, "flashinfer", graphs=not args.eager, max_running=max(64, args.bs),
                      decode_bs=[args.bs], prefill_graphs=False)
    fill_decode(eng, args.bs)
    time_steps(eng, 10)
    torch.cuda.nvtx.range_push(RANGE)
    for _ in range(args.steps):
        eng.step()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    print(f"profiled: {args.steps} decode steps of {args.shape} at {args.bs} rows "
          f"({'eager' if args.eager else 'graphs'}; {eng.attention.describe()})", flush=True)
    eng.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="what", required=True)
    a = sub.add_parser("attn")
    a.add_argument("--shape", default="llama-3.1-8b")
    a.add_argument("--cases", default="64:220:engine")
    s = sub.add_parser("step")
    s.add_argument("--shape", default="llama-3.1-8b")
    s.add_argument("--bs", type=int, default=64)
    s.add_argument("--steps", type=int, default=2)
    s.add_argument("--eager", action="store_true")
    args = ap.parse_args()
    (attn if args.what == "attn" else step)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
