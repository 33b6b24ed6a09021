"""The skinny projections on row-major weights against copies in their launch's tile order
(``skinny.pack``), on a decoder's o -> gate|up -> down chain, measured as a decode graph runs it.

Why: row-major, a program's [BLOCK_N, BLOCK_K] weight tile is BLOCK_N runs of BLOCK_K elements a row pitch
apart (128-512 bytes each); packed, it is one contiguous block, so HBM serves whole pages.

    python bench/packed_bench.py [--shapes llama-3.1-8b] [--m 8,64] [--layers 32] [--rounds 7]

Both variants replay one graph over ``--layers`` distinct weight copies (weights stream from HBM), interleaved
round by round, with the shipped configs of the row class; their results are compared bit for bit.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from floor import copy_bandwidth  # noqa: E402
from gemv_bench import ops_for  # noqa: E402

from graphtop.models.kernels import skinny as ts  # noqa: E402
from graphtop.models.kernels import skinny_tuning as st  # noqa: E402


CHAIN = ("o", "gate_up", "down")


def shapes_of(shape: str) -> dict[str, tuple[int, int]]:
    """(N, K) of the chain's weights (gate|up: [gate | up], 2I rows), from ``gemv_bench.ops_for``."""
    return {name: (n, k) for name, n, k, _ in ops_for(shape) if name in CHAIN}


def configs(shape: str, m: int) -> dict[str, st.Config] | None:
    """The shipped configs of o, gate|up (with SiLU·mul) and down at m rows, None if one is missing."""
    cls = st.row_class(m)
    cfg = {name: st.TUNED.get((n, k, cls, name == "gate_up")) for name, (n, k) in shapes_of(shape).items()}
    return None if any(v is None for v in cfg.values()) else cfg  # type: ignore[return-value]


def chain(cfg: dict[str, st.Config], weights: list, attended: torch.Tensor, residual: torch.Tensor,
          packed: bool) -> None:
    """One pass over the layers: o adds into the residual, gate|up normalises it, down adds again."""
    for wo, wgu, wd in weights:
        ss = ts.skinny_add(attended, wo, residual, config=cfg["o"], packed=packed)
        gu = ts.skinny(residual, wgu, config=cfg["gate_up"], silu_mul=True, norm=ts.NormInput(ss, 1e-5),
                       packed=packed)
        ts.skinny_add(gu, wd, residual, config=cfg["down"], packed=packed)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="llama-3.1-8b")
    ap.add_argument("--m", default="8,64")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=10, help="graph replays per round and variant")
    args = ap.parse_args()
    dev = torch.device("cuda")
    bw = copy_bandwidth(dev)
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    for shape in args.shapes.split(","):
        dims = shapes_of(shape)
        h, q = dims["o"]
        gen = torch.Generator(device=dev).manual_seed(0)

        def w(n: int, k: int) -> torch.Tensor:
            return (torch.randn(n, k, generator=gen, device=dev) * k ** -0.5).to(torch.bfloat16)

        weights = [tuple(w(*dims[name]) for name in CHAIN) for _ in range(args.layers)]
        layer_us = sum(t.numel() * t.element_size() for t in weights[0]) / bw * 1e6
        for m in (int(v) for v in args.m.split(",")):
            cfg = configs(shape, m)
            if cfg is None:
                print(f"{shape} m={m}: no skinny config for o, gate|up and down", flush=True)
                continue
            attended = torch.randn(m, q, generator=gen, device=dev).to(torch.bfloat16)
            packed_weights = [(ts.pack(wo, cfg["o"]), ts.pack(wgu, cfg["gate_up"], True), ts.pack(wd, cfg["down"]))
                              for wo, wgu, wd in weights]
            graphs, residuals = [], []
            for ws, packed in ((weights, False), (packed_weights, True)):
                residual = torch.zeros(m, h, device=dev, dtype=torch.bfloat16)
                chain(cfg, ws, attended, residual, packed)  # compile and warm up, eagerly
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    chain(cfg, ws, attended, residual, packed)
                graphs.append(g)
                residuals.append(residual)
            times: list[list[float]] = [[], []]
            for _ in range(args.rounds):
                for g, residual, t in zip(graphs, residuals, times):
                    residual.zero_()
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    for _ in range(args.reps):
                        g.replay()
                    b.record()
                    b.synchronize()
                    t.append(a.elapsed_time(b) * 1e3 / args.reps / args.layers)
            same = torch.equal(residuals[0], residuals[1])
            print(f"{shape} m={m}: o {cfg['o']} gate|up {cfg['gate_up']} down {cfg['down']}; the weight bytes a "
                  f"layer at the copy bandwidth {layer_us:.2f} µs; packed equal to row-major: {same}", flush=True)
            for name, t in zip(("row-major", "packed"), times):
                med = statistics.median(t)
                print(f"  {name:10s} {med:8.2f} µs a layer ({layer_us / med * 100:5.1f} % of the bytes), "
                      f"min {min(t):.2f}", flush=True)
            del packed_weights, graphs
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
