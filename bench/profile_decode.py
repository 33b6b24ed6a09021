"""Where a graph decode step's time goes, and what each speed-up buys: step time for a ladder of
variants (overlap schedule, fused-GEMV layers, one-launch decode attention, PDL), the GPU kernels of a few
steps (torch.profiler) and the host functions (cProfile), for one batch size.

    python3 bench/profile_decode.py [--shapes qwen3-0.6b,llama-3.1-8b] [--bs 1,8,64] [--out DIR]
        [--ab ";norms=separate"]  (profile each bench/ab_decode.py variant in turn)
        [--eager]  (no graphs: the eager step a shape without a graph runs, its kernels and host profile)
    python3 bench/profile_decode.py --timeline TRACE.json [--trace-steps 10] [--layers 28] [--bytes BYTES.json]
    python3 bench/profile_decode.py --ncu --shapes llama-3.1-8b --bs 64 [--ncu-steps 2] [--eager]

Writes ``profile_<shape>_bs<bs>.json`` (Chrome trace of the last variant; open in Perfetto) under --out, and
beside it ``profile_<shape>_bs<bs>.bytes.json``, what each of its kernels' launches reads (``--bytes``): the
timeline printed for each variant gives launches per layer and each kernel's bandwidth.

The timeline: which kernels (and copies) a decode step's wall time is spent in, from a torch.profiler Chrome
trace. Each GPU kernel is charged the busy time by which it pushed the stream's frontier (the latest end seen
so far) forward, and the idle time before it started (the GPU running nothing) is reported as its gap. Why:
with programmatic dependent launch a kernel starts before its predecessor ends and waits inside, so the
profiler's per-kernel durations overlap and add up to more than the step; what a kernel costs the step is how
far it moves the end of the work. Kernels are told apart by name, grid and their place after the step's
attention kernel, so the four projections of a layer (one GEMV kernel with different grids and places) get a
row each. ``--timeline`` reads a saved trace (no GPU needed): with the model's layer count it says how many
launches (and copies) a layer takes, with the bytes each kernel's launch reads each kernel's achieved
bandwidth over its own duration.

``--ncu`` runs whole decode steps of a live engine (random weights, prompt 128; graphs replayed unless
--eager) inside an NVTX range named ``ncu``, for Nsight Compute (``ncu --nvtx --nvtx-include "ncu/" ...``;
scripts/ncu_check.sh runs the usual reports): timing alone says how long a kernel takes, not whether it waits
on DRAM, on latency or on its issue slots; the hardware counters say which, per kernel.
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
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

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
TRACE_STEPS = 10  # decode steps in each variant's trace


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
    ap.add_argument("--timeline", type=Path, metavar="TRACE", help="only print the wall-time table of a saved trace")
    ap.add_argument("--trace-steps", type=int, default=TRACE_STEPS, help="--timeline: decode steps the trace holds")
    ap.add_argument("--layers", type=int, default=0, help="--timeline: the model's layers: launches per layer too")
    ap.add_argument(
        "--bytes", type=Path, help='--timeline: JSON {"name grid=[...]" or "name": bytes a launch reads}: bandwidth'
    )
    ap.add_argument("--ncu", action="store_true", help="only run --ncu-steps decode steps in the NVTX range ncu")
    ap.add_argument("--ncu-steps", type=int, default=2, help="--ncu: decode steps inside the range")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.timeline is not None:
        try:  # a file that is missing or not JSON: one line, exit 2
            launch_bytes = json.loads(args.bytes.read_text()) if args.bytes else None
            text = report(args.timeline, args.trace_steps, args.layers, launch_bytes)
        except (OSError, ValueError) as e:
            ap.error(f"cannot read the trace or the byte counts: {e}")
        print(text)
        return 0
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device")
    if args.ncu:
        for shape in args.shapes.split(","):
            for bs in comma_ints(args.bs):
                ncu_steps(shape, bs, args.ncu_steps, args.eager)
        return 0
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


def kernel_table(eng: Any, rows: int) -> tuple[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as p:
        time_steps(eng, TRACE_STEPS)
    return p.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=60), p


def launch_bytes(model: Any, rows: int, context: int) -> dict[str, int]:
    """What one launch of each decode kernel reads at ``rows`` rows (``--bytes`` of the timeline): a
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
                f"[{tag}] {name}: wall time by kernel (bandwidth at context {context})\n"
                f"{report(trace, TRACE_STEPS, layers, nbytes)}"
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


NCU_RANGE = "ncu"


def ncu_steps(shape: str, bs: int, steps: int, eager: bool) -> None:
    """Whole decode steps of a live engine inside the NVTX range ``ncu`` (warmed up outside it)."""
    eng = make_engine(
        random_ckpt(shape),
        "flashinfer",
        graphs=not eager,
        max_running=max(64, bs),
        decode_bs=[bs],
        prefill_graphs=False,
    )
    fill_decode(eng, bs)
    time_steps(eng, 10)
    torch.cuda.nvtx.range_push(NCU_RANGE)
    for _ in range(steps):
        eng.step()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    log(
        f"profiled: {steps} decode steps of {shape} at {bs} rows "
        f"({'eager' if eager else 'graphs'}; {eng.attention.describe()})"
    )
    eng.close()


ATTENTION_MARKERS = ("_decode_kernel", "BatchDecode", "decode_attention")
# device work the profiler records: kernels, and the copies and memsets a stream also runs in turn
# (between two decode graphs those, and the launch gaps before them, were most of the idle time)
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


@dataclass
class Row:
    """One kernel kind's totals over the trace."""

    count: int = 0
    busy_us: float = 0.0
    gap_us: float = 0.0
    advance_us: float = 0.0
    early_us: float = 0.0  # how long it ran before the frontier (inside its predecessor, PDL)


def short(name: str) -> str:
    for cut in ("(", "<"):
        name = name.split(cut)[0]
    return name[:48]


def kernels(trace: dict) -> list[dict]:
    """The trace's device work (``DEVICE_CATS``), in start order."""
    evs = [e for e in trace.get("traceEvents", []) if e.get("cat") in DEVICE_CATS and e.get("ph") == "X"]
    return sorted(evs, key=lambda e: e["ts"])


def attribute(evs: list[dict]) -> dict[str, Row]:
    rows: dict[str, Row] = defaultdict(Row)
    frontier = None
    since_attn = -1
    for e in evs:
        name = short(e["name"])
        if any(m in e["name"] for m in ATTENTION_MARKERS):
            since_attn = 0
        elif since_attn >= 0:
            since_attn += 1
        key = f"{name} grid={list(e.get('args', {}).get('grid', []))}"
        if since_attn >= 0:
            key += f" @attn+{since_attn}"
        start, end = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        r = rows[key]
        r.count += 1
        r.busy_us += end - start
        if frontier is None:
            frontier = start
        r.gap_us += max(0.0, start - frontier)
        r.early_us += max(0.0, frontier - start)
        r.advance_us += max(0.0, end - max(frontier, start))
        frontier = max(frontier, end)
    return rows


def bytes_of(key: str, launch_bytes: dict[str, int]) -> int | None:
    """The bytes one launch of row ``key`` reads: ``launch_bytes`` by "name grid=[...]", else by name."""
    base = key.split(" @attn")[0]
    found = launch_bytes.get(base)
    return found if found is not None else launch_bytes.get(base.split(" grid=")[0])


def report(trace_path: Path, steps: int, layers: int = 0, launch_bytes: dict[str, int] | None = None) -> str:
    """The table; with ``layers``, launches per layer too; with ``launch_bytes`` (what a launch of a kernel
    reads, by "name grid=[...]" or by name), each kernel's achieved bandwidth over its own duration."""
    rows = attribute(kernels(json.loads(trace_path.read_text())))
    total = sum(r.advance_us for r in rows.values())
    lines = [
        f"{'kernel (grid, place after attention)':80s} {'n/step':>6s} {'dur us':>7s} {'gap us':>7s} "
        f"{'early us':>8s} {'charged us/step':>15s} {'share':>6s} {'GB/s':>6s}"
    ]
    for key, r in sorted(rows.items(), key=lambda kv: -kv[1].advance_us):
        n = r.count
        nbytes = bytes_of(key, launch_bytes or {})
        bandwidth = f"{nbytes / (r.busy_us / n) / 1e3:6.0f}" if nbytes and r.busy_us > 0 else f"{'':6s}"
        lines.append(
            f"{key:80s} {n / steps:6.1f} {r.busy_us / n:7.2f} {r.gap_us / n:7.2f} "
            f"{r.early_us / n:8.2f} {r.advance_us / steps:15.1f} {r.advance_us / total:6.1%} {bandwidth}"
        )
    gaps = sum(r.gap_us for r in rows.values())
    lines.append(
        f"{'total busy (charged) / idle (gaps) per step':80s} {'':6s} {'':7s} {gaps / steps:7.1f} "
        f"{'':8s} {total / steps:15.1f}"
    )
    launches = sum(r.count for r in rows.values()) / steps
    per_layer = f", {launches / layers:.2f} a layer ({layers} layers)" if layers else ""
    lines.append(f"device work items per step: {launches:.1f}{per_layer}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
