"""Host time of eager decode: kernels launched by ``FastKernel`` (models/kernels/launch.py) against Triton's own
launch path, in interleaved rounds (ABBA) on one live model.

    python3 bench/eager_launch_bench.py [--shape qwen3-0.6b] [--bs 1] [--rounds 6] [--steps 50] [--device cuda]

``--device cuda``: an engine without graphs (every decode step eager, on the fused kernels as served); the
figure is the whole serving step's wall time. ``--device stub`` (no GPU; needs Triton): the model's decode
forward on the CPU against an sm_90 stand-in driver, every launch a no-op (tests/support/triton_host.py), so the
figure is the forward's host time alone; its kernels compile for sm_90 once, into a temporary folder.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch
from harness import REPO, drain, fill_decode, log, make_engine, md_table, random_ckpt, time_steps


def rounds(run: Callable[[], float], n: int) -> dict[str, list[float]]:
    """``run()`` (ms a step) in ABBA order over ``n`` rounds: fast, triton, triton, fast, ..."""
    from graphtop.models.kernels import launch  # needs Triton

    out: dict[str, list[float]] = {"fast": [], "triton": []}
    order = ["fast", "triton", "triton", "fast"]
    try:
        for i in range(n * 2):
            name = order[i % 4]
            launch.ENABLED = name == "fast"
            out[name].append(run())
    finally:
        launch.ENABLED = True
    return out


def cuda_rounds(args: argparse.Namespace) -> dict[str, list[float]]:
    ckpt = random_ckpt(args.shape)
    eng = make_engine(ckpt, "flashinfer", graphs=False, max_running=max(8, args.bs))
    handles = fill_decode(eng, args.bs, max_new_tokens=5 + args.rounds * 2 * args.steps + 8)
    time_steps(eng, 5)  # every kernel's first launch (compiles, plans)
    out = rounds(lambda: time_steps(eng, args.steps), args.rounds)
    drain(eng, handles)
    return out


def stub_rounds(args: argparse.Namespace) -> dict[str, list[float]]:
    sys.path.insert(0, str(REPO / "tests"))  # the tests' stand-in sm_90 driver
    from support.triton_host import (
        PagedAttention,
        compile_ahead,
        fused_kernels_on_cpu,
        fused_model,
        hopper_driver,
        stubbed_launches,
    )

    from graphtop.models.kernels import precompile

    torch.set_num_threads(1)
    layers = {"num_hidden_layers": args.layers} if args.layers else {}
    launches = [0]

    def count(*_: object) -> None:
        launches[0] += 1

    with tempfile.TemporaryDirectory() as cache:
        precompile.point_triton_cache(Path(cache) / "triton")
        with hopper_driver(), stubbed_launches(count), fused_kernels_on_cpu(), torch.inference_mode():
            model = fused_model(args.shape, fused_mlp=args.fused_mlp, **layers)
            ids, pos = torch.arange(args.bs), torch.arange(args.bs) + 7
            attn = PagedAttention(model.spec, args.bs)
            missing, _ = compile_ahead(lambda: model.decode_logits(ids, pos, attn))
            launches[0] = 0
            model.decode_logits(ids, pos, attn)
            log(f"{launches[0]} launches a forward ({len(missing)} kernel variants, compiled for sm_90)")

            def forward_ms() -> float:
                t = time.perf_counter()
                for _ in range(args.steps):
                    model.decode_logits(ids, pos, attn)
                return (time.perf_counter() - t) / args.steps * 1e3

            if args.profile:
                profile = cProfile.Profile()
                profile.runcall(forward_ms)
                pstats.Stats(profile).sort_stats("tottime").print_stats(args.profile)
            return rounds(forward_ms, args.rounds)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-0.6b")
    ap.add_argument("--bs", type=int, default=1, help="decode rows (1-4: the fused-GEMV layers)")
    ap.add_argument("--rounds", type=int, default=6, help="rounds of each (ABBA order)")
    ap.add_argument("--steps", type=int, default=50, help="steps (forwards) a round")
    ap.add_argument("--device", choices=["cuda", "stub"], default="cuda")
    ap.add_argument("--layers", type=int, default=0, help="stub: this many decoder layers (default: the shape's)")
    ap.add_argument("--profile", type=int, default=0, help="stub: print the N costliest host functions (cProfile)")
    ap.add_argument("--fused-mlp", action="store_true", help="stub: each MLP in one launch (KernelConfig.fused_mlp)")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if not 1 <= args.bs <= 4:
        ap.error(f"--bs {args.bs}: the fused-GEMV layers take 1-4 rows")
    if args.rounds < 1 or args.steps < 1:
        ap.error("--rounds and --steps must be at least 1")
    figures = cuda_rounds(args) if args.device == "cuda" else stub_rounds(args)
    fast, slow = statistics.median(figures["fast"]), statistics.median(figures["triton"])
    what = "serving step (eager), ms" if args.device == "cuda" else "decode forward host time (launches stubbed), ms"
    log(f"\n{args.shape} bs {args.bs}, {args.device}: {what}, median of {args.rounds} rounds of {args.steps}")
    row = [f"{fast:.3f}", f"{slow:.3f}", f"{fast / slow:.3f}"]
    log(md_table(["FastKernel", "Triton's launch", "FastKernel ÷ Triton"], [row]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
