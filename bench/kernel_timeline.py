"""Which kernels (and copies) a decode step's wall time is spent in, from a torch.profiler Chrome trace: each GPU
kernel is charged the busy time by which it pushed the stream's frontier (the latest end seen so far)
forward, and the idle time before it started (the GPU running nothing) is reported as its gap.

Why: with programmatic dependent launch a kernel starts before its predecessor ends and waits inside,
so the profiler's per-kernel durations overlap and add up to more than the step; what a kernel costs
the step is how far it moves the end of the work. Kernels are told apart by name, grid and their
place after the step's attention kernel, so the four projections of a layer (one GEMV kernel with
different grids and places) get a row each.

    python3 bench/kernel_timeline.py TRACE.json [--steps 10] [--layers 28] [--bytes BYTES.json]

With the model's layer count it says how many launches (and copies) a layer takes; with the bytes each
kernel's launch reads (bench/profile_decode.py writes them beside its trace) each kernel's achieved
bandwidth over its own duration.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

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


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--steps", type=int, default=10, help="decode steps the trace holds")
    ap.add_argument("--layers", type=int, default=0, help="the model's decoder layers: launches per layer too")
    ap.add_argument(
        "--bytes", type=Path, help='JSON {"name grid=[...]" or "name": bytes a launch reads}: bandwidth per kernel'
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    try:  # a file that is missing or not JSON: one line, exit 2
        launch_bytes = json.loads(args.bytes.read_text()) if args.bytes else None
        text = report(args.trace, args.steps, args.layers, launch_bytes)
    except (OSError, ValueError) as e:
        ap.error(f"cannot read the trace or the byte counts: {e}")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
