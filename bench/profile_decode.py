"""Where a graph decode step's time goes, and what each speed-up buys: step time for a ladder of
variants (overlap schedule, fused-GEMV layers, one-launch decode attention, PDL), the GPU kernels of a few
steps (torch.profiler) and the host functions (cProfile), for one batch size.

    python3 bench/profile_decode.py [--shapes qwen3-0.6b,llama-3.1-8b] [--bs 1,8,64] [--out DIR]
        [--ab ";norms=separate"]  (profile each bench/ab_decode.py variant in turn)
        [--eager]  (no graphs: the eager step a shape without a graph runs, its kernels and host profile)

Writes ``profile_<shape>_bs<bs>.json`` (Chrome trace of the last variant; open in Perfetto) under --out, and
beside it ``profile_<shape>_bs<bs>.bytes.json``, what each of its kernels' launches reads (bench/kernel_timeline.py
--bytes): the timeline printed for each variant gives launches per layer and each kernel's bandwidth.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

import kernel_timeline
import torch
from ab_decode import apply
from harness import PROMPT_LEN, comma_ints, drain, fill_decode, log, make_engine, random_ckpt, release_cuda, time_steps

from graphtop.engine.kernel_config import KernelConfig
from graphtop.engine.telemetry.bus import EventBus

# name, fused-GEMV rows, overlap schedule, FlashInfer decode kernel, fused-GEMV policy, PDL policy
VARIANTS = [
    ("cublas layers, no overlap", 0, False, "flashinfer", "off", "off"),
    ("+ overlap schedule", 0, True, "flashinfer", "off", "off"),
    ("+ fused GEMV layers", 1, True, "flashinfer", "auto", "off"),
    ("+ one-launch triton decode", 1, True, "auto", "auto", "off"),
    ("+ programmatic dependent launch", 1, True, "auto", "auto", "auto"),
]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="qwen3-0.6b")
    ap.add_argument("--bs", default="1", help="batch sizes, comma list (one checkpoint per shape)")
    ap.add_argument("--attention", default="flashinfer")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--variants", default="", help="comma list of variant indices (default: all)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--eager", action="store_true", help="profile eager steps (no graphs) instead of replays")
    ap.add_argument(
        "--ab",
        default="",
        help="';'-separated bench/ab_decode.py variants, each profiled in turn with "
        "its launch settings (sk=, norms=, tuning=block_t/min_chunk/warps/stages[/prefetch[/waves]], "
        "large=, ...; the ladder above still picks the kernel config); the i-th one's trace is "
        "profile_<shape>_bs<bs>_ab<i>.json",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device")
    Path(args.out).mkdir(parents=True, exist_ok=True)  # the traces land here after minutes of work
    ab: list[Optional[str]] = [*args.ab.split(";")] if args.ab else [None]
    for shape in args.shapes.split(","):
        ckpt = random_ckpt(shape)
        for bs in comma_ints(args.bs):
            for i, variant in enumerate(ab):
                if variant is not None:
                    apply(variant)  # module-level settings for the engines built next
                profile_shape(shape, ckpt, bs, args, "" if variant is None else f"_ab{i}", variant)
        del ckpt
        release_cuda()
    if args.ab:
        apply("")
    return 0


TRACE_STEPS = 10


def kernel_table(eng: Any, rows: int) -> tuple[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as p:
        time_steps(eng, TRACE_STEPS)
    return p.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=60), p


def launch_bytes(model: Any, rows: int, context: int) -> dict[str, int]:
    """What one launch of each decode kernel reads at ``rows`` rows (bench/kernel_timeline.py's ``--bytes``): a
    fused-GEMV launch its weight (keyed by the grid its launch shape gives: a grid two projections share is
    left out), the one-launch MLP both its weights, the decode attention kernel a layer's K/V at ``context``
    tokens a row (keyed by name: its split count varies). Empty off the fused-GEMV rows."""
    from graphtop.models.kernels import fused_mlp as tm
    from graphtop.models.kernels import gemv as tg

    if not model.fused_gemv_rows or rows > model.fused_gemv_rows:
        return {}
    found: dict[str, Optional[int]] = {}

    def add(key: str, nbytes: int) -> None:
        found[key] = nbytes if found.get(key, nbytes) == nbytes else None

    layer = model.model.layers[0]
    qkv, o, gate_up, down = layer.projections()
    gemvs = ((qkv, 1), (o, 0), (model.lm_head, 1))
    if not layer.kernels.fused_mlp:
        gemvs += ((gate_up, 1), (down, 2))
    for proj, prologue in gemvs:
        grid = tg.launch_grid(rows, *proj.weight.shape, prologue)
        add(f"_gemv_kernel grid={[grid[0], grid[1], 1]}", proj.weight.numel() * proj.weight.element_size())
    if layer.kernels.fused_mlp:
        w = (gate_up.weight, down.weight)
        programs = tm.launch_programs(*down.weight.shape)
        add(f"_fused_mlp_kernel grid={[programs, 1, 1]}", sum(t.numel() * t.element_size() for t in w))
    spec = model.spec
    add("_decode_kernel", rows * context * spec.num_kv_heads * spec.head_dim * 2 * qkv.weight.element_size())
    return {key: v for key, v in found.items() if v is not None}


def profile_shape(
    shape: str, ckpt: Any, bs: int, args: argparse.Namespace, suffix: str = "", ab_variant: Optional[str] = None
) -> None:
    mode = " eager" if args.eager else ""
    tag = f"{shape} bs {bs} {args.attention}{mode}" + (
        f" [{ab_variant or 'defaults'}]" if ab_variant is not None else ""
    )
    picked = [VARIANTS[int(i)] for i in args.variants.split(",")] if args.variants else VARIANTS
    for n, (name, rows, overlap, kernel, gemv, pdl) in enumerate(picked):
        kernels = KernelConfig(fused_gemv=gemv, decode_kernel=kernel, pdl=pdl)
        bus = EventBus()
        caps = bus.subscribe("captures", types={"capture_progress"})
        try:
            eng = make_engine(
                ckpt,
                args.attention,
                graphs=not args.eager,
                bus=bus,
                max_running=max(64, bs),
                gemv_rows=rows,
                overlap_schedule=overlap,
                kernels=kernels,
            )
        except Exception as exc:  # report and go on with the next variant
            log(f"[{tag}] {name}: engine failed: {type(exc).__name__}: {exc}")
            continue
        failed = [(e.phase, e.bucket, e.failure_reason) for e in caps.drain() if not e.ok]
        bus.unsubscribe(caps)
        if failed:
            log(f"[{tag}] {name}: {len(failed)} captures failed, first: {failed[0]}")
        handles = fill_decode(eng, bs)
        time_steps(eng, 10)
        ms = sorted(time_steps(eng, args.steps) for _ in range(3))[1]
        log(
            f"[{tag}] {name:40s} {'eager' if args.eager else 'graph'} step {ms:.3f} ms "
            f"({eng.attention.describe()}, gemv rows "
            f"{eng.model.fused_gemv_rows}, overlapped {eng.overlapped_steps})"
        )
        context = PROMPT_LEN + round(sum(len(h._token_ids) for h in handles) / len(handles)) + TRACE_STEPS // 2
        table, prof = kernel_table(eng, 14)
        log(table)
        nbytes = launch_bytes(eng.model, bs, context)
        layers = eng.spec.num_layers
        with tempfile.TemporaryDirectory() as tmp:
            trace = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(trace))  # a profile exports once: the last variant's is kept
            log(
                f"[{tag}] {name}: wall time by kernel (bench/kernel_timeline.py; bandwidth at context {context})\n"
                f"{kernel_timeline.report(trace, TRACE_STEPS, layers, nbytes)}"
            )
            if n == len(picked) - 1:
                shutil.copyfile(trace, Path(args.out) / f"profile_{shape}_bs{bs}{suffix}.json")
                Path(args.out, f"profile_{shape}_bs{bs}{suffix}.bytes.json").write_text(json.dumps(nbytes))
        if n == len(picked) - 1:
            cp = cProfile.Profile()
            cp.enable()
            time_steps(eng, args.steps)
            cp.disable()
            s = io.StringIO()
            pstats.Stats(cp, stream=s).sort_stats("tottime").print_stats(22)
            log(f"[{tag}] host profile over {args.steps} steps (tottime)\n{s.getvalue()}")
        drain(eng, handles)
        eng.close()  # graphs released here, not by a GC pass during the next variant's capture
        del eng, handles
        release_cuda()


if __name__ == "__main__":
    sys.exit(main())
