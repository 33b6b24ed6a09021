"""Decode projections at 1-256 rows against cuBLAS: the split-K skinny Triton GEMM (2-256 rows) or the fused GEMV.

Skinny (the default): cuBLAS (plus the SiLU·mul kernel after gate|up, as the fused-kernel path runs them)
against the split-K skinny Triton GEMM (models/kernels/skinny.py), per launch config, measured as a decode
graph runs them (``harness.graph_us``: one graph over a distinct weight copy per layer, so weights stream
from HBM).

    python3 bench/skinny_bench.py [--shapes qwen3-0.6b,llama-3.1-8b] [--m 8,64] [--sweep] [--budget-s 300]
        [--tuned-out FILE]

``--sweep`` tries the shipped config, then the grid (best-first order, stopping at the time budget), and
prints the best per (N, K, row class, silu) as a ``TUNED`` dict, with the per-layer sum against cuBLAS;
each line also gives the shipped config's time.

``--gemv``: small-batch projections (1 row by default), cuBLAS (+ the separate norm/SiLU/add kernels it
needs) against the fused Triton GEMV (models/kernels/gemv.py), per launch config, the same way.

    python3 bench/skinny_bench.py --gemv [--shapes qwen3-0.6b,llama-3.1-8b] [--m 1] [--sweep] [--wide] [--decode]

The table gives µs per op, weight GB/s and the fraction of the measured copy bandwidth; ``--sweep`` tries
the config grid and prints the best config per (N, K) as a ``TUNED`` dict for models/kernels/gemv.py;
``--decode`` then times the decode step at bs 1 with the shipped configs against the swept ones.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
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
from graphtop.models.kernels import skinny as ts
from graphtop.models.kernels import skinny_tuning as st
from graphtop.models.synthetic.random_model import SHAPES

# (BLOCK_N, BLOCK_K, SPLIT_K, warps, stages), likeliest first so a cut-off sweep has tried them; SPLIT_K
# 0 / -2: stream-K over one / two programs an SM
GRID = [
    (bn, bk, sp, 4, st)
    for st in (4, 3, 6)
    for bk in (128, 256, 64)
    for bn in (64, 32, 16, 128)
    for sp in (1, 0, 2, -2, 4, 8, 16)
]
# from 65 rows the activation tile is as wide as the weight tile or wider: shorter K tiles, eight warps too
WIDE_M_GRID = [
    (bn, bk, sp, w, st)
    for st in (3, 4, 2)
    for bn, w in ((64, 4), (128, 8), (64, 8))
    for bk in (64, 128)
    for sp in (1, 2, 4, 8)
]

GEMV_GRID = [c for c in itertools.product((8, 16, 32), (256, 512, 1024), (4, 8), (2, 4)) if c[0] * c[1] <= 16384]
# --wide: more, longer K tiles and fewer rows a program (more programs in flight for small N)
GEMV_WIDE_GRID = [c for c in itertools.product((4, 8, 16), (1024, 2048), (4, 8), (2, 4)) if c[0] * c[1] <= 16384]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="qwen3-0.6b,llama-3.1-8b")
    ap.add_argument("--m", help="comma list of row counts (default 8,64; --gemv: 1); a GEMV --sweep tunes at the first")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--budget-s", type=float, default=300.0, help="wall time for the whole sweep")
    ap.add_argument("--per-op-s", type=float, default=0.0, help="cap per op (default: budget / ops)")
    ap.add_argument(
        "--ops",
        default="qkv,o,gate_up,down",
        help="also gate_up_plain: the gate|up GEMM without SiLU·mul in its epilogue, the kernel after it",
    )
    ap.add_argument("--tuned-out", help="write the best config per (N, K, row class, silu) here as JSON")
    ap.add_argument("--gemv", action="store_true", help="the fused GEMV (models/kernels/gemv.py) instead")
    ap.add_argument("--wide", action="store_true", help="--gemv --sweep: sweep GEMV_WIDE_GRID instead of GEMV_GRID")
    ap.add_argument(
        "--decode",
        action="store_true",
        help="--gemv, after the sweep: decode step at bs 1 with the shipped configs vs the swept ones",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device")
    bw = copy_bandwidth(torch.device("cuda"))
    log(f"copy bandwidth {bw / 1e12:.2f} TB/s")
    if args.gemv:
        args.m = args.m or "1"
        return gemv_main(args, bw)
    args.m = args.m or "8,64"
    dt, dev = torch.bfloat16, "cuda"
    wanted = args.ops.split(",")

    def ops_with_plain_gate_up(shape: str) -> list[tuple[str, int, int, str]]:
        ops = projections(shape)
        return ops + [("gate_up_plain",) + op[1:] for op in ops if op[0] == "gate_up"]

    cases = [
        (shape, m, op)
        for shape, m in itertools.product(args.shapes.split(","), comma_ints(args.m))
        for op in ops_with_plain_gate_up(shape)
        if op[0] in wanted
    ]
    per_op = args.per_op_s or args.budget_s / max(1, len(cases))
    tuned: dict[tuple[int, int, int, bool], tuple] = {}
    totals: dict[tuple[str, int], list[float]] = {}
    for shape, m, (name, n, k, _kind) in cases:
        silu = name == "gate_up"
        silu_after = name == "gate_up_plain"  # the SiLU·mul kernel after the plain GEMM, in both timings
        layers = max(SHAPES[shape]["num_hidden_layers"], -(-(256 << 20) // (n * k * 2)))
        ws = [torch.randn(n, k, dtype=dt, device=dev) * 0.02 for _ in range(layers)]
        x = torch.randn(m, k, dtype=dt, device=dev)

        def cublas(layer: int) -> None:
            y = F.linear(x, ws[layer])
            if silu or silu_after:
                tk.silu_and_mul(y)

        def sk(cfg: tuple, pdl: bool) -> Callable[[int], None]:
            def run(layer: int) -> None:
                y = ts.skinny(x, ws[layer], silu_mul=silu, config=cfg, pdl=pdl)
                if silu_after:
                    tk.silu_and_mul(y)

            return run

        cls = st.row_class(m)
        t_cub = graph_us(cublas, layers)
        shipped = st.TUNED.get((n, k, cls, silu))
        # the shipped config first, so a sweep cut off by its time cap still compares against it
        grid = GRID if m <= 64 else WIDE_M_GRID
        configs = [
            c
            for c in dict.fromkeys([shipped] + (grid if args.sweep else []))
            if c
            and st.config_ok(n, k, c, silu)
            and (c[2] <= 0 or 64 <= (n // (2 if silu else 1)) // c[0] * c[2] <= 4096)
        ]
        best, t_shipped, unfit = None, None, 0
        t0 = time.time()
        for cfg in configs:
            if time.time() - t0 > per_op:
                print(f"  time cap: {configs.index(cfg)} of {len(configs)} configs tried", flush=True)
                break
            try:
                t = graph_us(sk(cfg, True), layers)
            except Exception as exc:  # a config that does not compile or fit is skipped
                if "OutOfResources" in type(exc).__name__:
                    unfit += 1
                else:
                    print(f"  {cfg}: {type(exc).__name__} {str(exc)[:80]}", flush=True)
                continue
            if cfg == shipped:
                t_shipped = t
            if best is None or t < best[0]:
                best = (t, cfg)
        if unfit:
            print(f"  {unfit} configs need more shared memory or registers than an SM has", flush=True)
        if best is None:
            print(f"{shape} M={m} {name}: no config ran", flush=True)
            continue
        t_nopdl = graph_us(sk(best[1], False), layers)
        ref = F.linear(x, ws[0])
        if silu:
            ref = tk.silu_and_mul(ref)
        got = ts.skinny(x, ws[0], silu_mul=silu, config=best[1])
        again = ts.skinny(x, ws[0], silu_mul=silu, config=best[1])
        err = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
        same = bool(torch.equal(got, again))
        tuned[(n, k, cls, silu)] = best[1]
        byts = n * k * 2
        tflop = 2 * m * n * k / 1e6  # TFLOP/s at µs
        tot = totals.setdefault((shape, m), [0.0, 0.0])
        tot[0] += t_cub
        tot[1] += min(best[0], t_cub)
        print(
            f"{shape:14s} M={m:3d} {name:8s} N={n:6d} K={k:6d}: "
            f"cuBLAS{'+silu' if silu or silu_after else ''} {t_cub:7.2f} us "
            f"({byts / t_cub * 1e8 / bw:5.1f}% bw), skinny {best[0]:7.2f} us ({byts / best[0] * 1e8 / bw:5.1f}% bw, "
            f"no PDL {t_nopdl:7.2f}; {tflop / t_cub:4.0f} / {tflop / best[0]:4.0f} TFLOP/s) cfg {best[1]} "
            f"rel err {err:.1e} deterministic {same}"
            + (f"; shipped {shipped} {t_shipped:7.2f} us" if t_shipped is not None else "; nothing shipped"),
            flush=True,
        )
        ws.clear()
        torch.cuda.empty_cache()
    for (shape, m), (cub, sk_) in totals.items():
        print(
            f"{shape} M={m}: one layer's projections cuBLAS {cub:.1f} us, best of each {sk_:.1f} us ({sk_ / cub:.3f})",
            flush=True,
        )
    print("TUNED = {" + ", ".join(f"{key}: {c}" for key, c in tuned.items()) + "}")
    if args.tuned_out:
        with open(args.tuned_out, "w") as f:
            json.dump([[list(key), list(c)] for key, c in tuned.items()], f)
    return 0


def gemv_main(args: argparse.Namespace, bw: float) -> int:
    """``--gemv``: the fused GEMV against cuBLAS per projection, its sweep, and the decode step with it."""
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
            grid = GEMV_WIDE_GRID if args.wide else GEMV_GRID
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
