"""Small-batch projections of real model shapes: cuBLAS (+ the separate norm/SiLU/add kernels it needs)
vs the fused Triton GEMV, per launch config, measured the way a decode graph runs them.

    python3 bench/gemv_bench.py [--shapes qwen3-0.6b,llama-3.1-8b] [--m 1] [--sweep]

Each variant is captured in a CUDA graph that runs the op once per layer over that many distinct weight
copies (so weights stream from HBM as in the model, never from L2), replayed several times; the table
gives µs per op, weight GB/s and the fraction of the measured copy bandwidth. ``--sweep`` tries the
config grid and prints the best config per (N, K) as a ``TUNED`` dict for models/kernels/gemv.py.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from typing import Callable

import torch
import torch.nn.functional as F
from harness import (
    PROMPT_LEN,
    comma_ints,
    copy_bandwidth,
    drain,
    fill_decode,
    floor_ms,
    graph_us,
    log,
    make_engine,
    projections,
    random_ckpt,
    release_cuda,
    time_steps,
)

from graphtop.models.kernels import fused as tk
from graphtop.models.kernels import gemv as tg
from graphtop.models.synthetic.random_model import SHAPES

GRID = [c for c in itertools.product((8, 16, 32), (256, 512, 1024), (4, 8), (2, 4)) if c[0] * c[1] <= 16384]
# --wide: more, longer K tiles and fewer rows a program (more programs in flight for small N)
WIDE_GRID = [c for c in itertools.product((4, 8, 16), (1024, 2048), (4, 8), (2, 4)) if c[0] * c[1] <= 16384]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="qwen3-0.6b,llama-3.1-8b")
    ap.add_argument("--m", default="1", help="comma list of row counts; --sweep tunes at the first")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--wide", action="store_true", help="sweep WIDE_GRID instead of GRID")
    ap.add_argument("--ops", default="qkv,o,gate_up,down")
    ap.add_argument(
        "--decode",
        action="store_true",
        help="after the sweep: decode step at bs 1 with the shipped configs vs the swept ones",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device")
    bw = copy_bandwidth(torch.device("cuda"))
    log(f"copy bandwidth {bw / 1e12:.2f} TB/s")
    ms = comma_ints(args.m)
    dt, dev = torch.bfloat16, "cuda"
    tuned: dict[tuple[int, int], tuple[int, int, int, int]] = {}
    for shape, m in itertools.product(args.shapes.split(","), ms):
        layers = SHAPES[shape]["num_hidden_layers"]
        for name, n, k, kind in projections(shape):
            if name not in args.ops.split(","):
                continue
            ws = [torch.randn(n, k, dtype=dt, device=dev) * 0.02 for _ in range(layers)]
            kin = 2 * k if kind == "silu_res" else k
            x = torch.randn(m, kin, dtype=dt, device=dev)
            nw = torch.randn(k, dtype=dt, device=dev)
            res = torch.randn(m, n, dtype=dt, device=dev)
            out = torch.empty(m, n, dtype=dt, device=dev)

            def cublas(layer: int) -> None:  # what the fused-kernel path does around this GEMM
                if kind == "norm":
                    F.linear(tk.rms_norm(x, nw, 1e-6), ws[layer])
                elif kind == "silu_res":
                    res.add_(F.linear(tk.silu_and_mul(x), ws[layer]))
                else:
                    res.add_(F.linear(x, ws[layer]))

            def plain(layer: int) -> None:
                F.linear(x[:, :k], ws[layer])

            def fused(cfg: tuple[int, int, int, int]) -> Callable[[int], None]:
                def run(layer: int) -> None:
                    if kind == "norm":
                        tg.gemv(x, ws[layer], norm_weight=nw, eps=1e-6, out=out, config=cfg)
                    elif kind == "silu_res":
                        tg.gemv(x, ws[layer], silu_mul=True, residual=res, out=res, config=cfg)
                    else:
                        tg.gemv(x, ws[layer], residual=res, out=res, config=cfg)

                return run

            byts = n * k * 2
            t_cub, t_plain = graph_us(cublas, layers), graph_us(plain, layers)
            grid = WIDE_GRID if args.wide else GRID
            configs = grid if args.sweep and m == ms[0] else [tuned.get((n, k)) or tg.pick_config(n, k)]
            best = None
            for cfg in configs:
                try:
                    t = graph_us(fused(cfg), layers)
                except Exception as exc:  # a config that does not compile/fit is skipped
                    log(f"  {cfg}: {type(exc).__name__}")
                    continue
                if best is None or t < best[0]:
                    best = (t, cfg)
            assert best is not None
            tuned.setdefault((n, k), best[1])
            # correctness of the winner against torch
            ref_in = x
            if kind == "norm":
                ref = F.linear(tk.rms_norm(ref_in, nw, 1e-6), ws[0])
                got = tg.gemv(x, ws[0], norm_weight=nw, eps=1e-6, config=best[1])
            elif kind == "silu_res":
                ref = res + F.linear(tk.silu_and_mul(x), ws[0])
                got = tg.gemv(x, ws[0], silu_mul=True, residual=res, config=best[1])
            else:
                ref = res + F.linear(x, ws[0])
                got = tg.gemv(x, ws[0], residual=res, config=best[1])
            err = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
            print(
                f"{shape:14s} M={m} {name:8s} N={n:6d} K={k:6d}: cuBLAS seq {t_cub:7.2f} us, cuBLAS GEMV alone "
                f"{t_plain:7.2f} us ({byts / t_plain * 1e8 / bw:5.1f}% bw), fused {best[0]:7.2f} us "
                f"({byts / best[0] * 1e8 / bw:5.1f}% bw) cfg {best[1]} rel err {err:.1e}",
                flush=True,
            )
            ws.clear()
            torch.cuda.empty_cache()
    if args.sweep:
        print("TUNED = {" + ", ".join(f"({n}, {k}): {c}" for (n, k), c in tuned.items()) + "}")
    if args.decode:
        for shape in args.shapes.split(","):
            decode_with(shape, tuned, bw)
    return 0


def decode_with(shape: str, tuned: dict, bw: float) -> None:
    """Graph decode step at bs 1 (FlashInfer, overlap on) with the shipped TUNED vs shipped + swept."""
    ckpt = random_ckpt(shape)
    shipped = dict(tg.TUNED)
    for label, table in (
        ("shipped configs", shipped),
        ("swept configs", {**shipped, **tuned}),
        ("shipped configs again", shipped),
    ):
        tg.TUNED.clear()
        tg.TUNED.update(table)
        eng = make_engine(ckpt, "flashinfer", graphs=True, max_running=16)
        handles = fill_decode(eng, 1)
        time_steps(eng, 10)
        ms = sorted(time_steps(eng, 100) for _ in range(5))[2]
        floor = floor_ms(ckpt.model, [PROMPT_LEN + len(handles[0].token_ids)], bw)
        print(
            f"{shape} bs 1 graph decode, {label}: {ms:.3f} ms, floor {floor:.3f} ms, {ms / floor:.3f}x floor",
            flush=True,
        )
        drain(eng, handles)
        eng.close()
        del eng, handles
        release_cuda()
    tg.TUNED.clear()
    tg.TUNED.update(shipped)


if __name__ == "__main__":
    sys.exit(main())
