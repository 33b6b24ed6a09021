"""What a fresh machine costs: a burst of synthetic requests served from load onwards, on empty caches (cold),
again on the caches the cold start filled (warm), and optionally cold with kernels compiled during capture.

    python3 bench/cold_start_bench.py --shape llama-3.1-8b --device cuda --requests 1000 --modes cold,warm,off
    python3 bench/cold_start_bench.py --shape tiny --device cpu --requests 8   # the smoke check (CPU)

Why: on CUDA a start compiles each bucket's Triton kernels (in worker processes, ahead of its capture) and
captures its graphs while it already serves; this measures what that costs the requests that arrive with
it, and what a second start, its kernels on disk, still costs.

Each start runs in a process of its own (Triton also keeps compiled kernels in memory, per process): the
parent runs one child per start and collects its JSON. Starts (``--modes``):

* cold: graphtop's cache folder ($GRAPHTOP_CACHE_DIR and ``EngineConfig.cache_dir``) is a new empty
  temporary folder, $TRITON_CACHE_DIR is unset (so Triton's cache is ``triton/`` inside it, empty too);
* warm: a second start on the folder the cold start filled;
* off: cold, on a folder of its own, with ``KernelConfig(precompile="off")`` (a capture compiles what it
  launches, on the step thread): the A/B against cold.

A child builds random weights of the shape (untimed), builds the engine with the default settings (the
default bucket lists, serving while it captures), submits the whole burst at once, the workload of
``graphtop --synthetic N`` (cli/workload.py, its default lengths unless --prompt-len / --output-len),
and steps until every request has finished and every graph is live. It reports:

* load s: the engine built (``Engine(...)``, weights already in memory);
* graphs live s: from the end of load to the last phase's ``CaptureFinished``; start to live: both;
* the worst and the p99 step launch time (``StepEvent.launch_ms``: the host time from the step's start,
  the capture slice before it included, to its forward launched, without the device wait of a step
  sampled at once, which ``host_ms`` holds) over the steps that started before every graph was live,
  and how many of those were over 50 ms;
* steps by path: ``graph``, or the fallback reason of an eager step (``kernels_compiling``, ...);
* TTFT p50 / p99 of the burst, output tokens/s from the first submit to the last request finished;
* Σ GPU step s: the sum of every step's GPU time (CUDA events): a graph step's replay
  (``StepEvent.replay_ms``), an eager step's forward (``StepEvent.forward_ms``); the ratio output tok/s ÷
  (output tokens ÷ Σ GPU step time) is the share of the run the GPU did not wait for the host. Steps
  without a GPU time (CPU) count as zero.

Targets (H200, random bf16 weights, default flags): no step's host time over 50 ms while a cold start's
default lists capture; the 8B's graphs all live <= 10 s after a cold load; a warm start <= 3 s from start
to all graphs live; the 8B's 1,000-request burst at a ratio >= 0.8 cold and >= 0.9 warm. They are checked
on CUDA only. Without CUDA (no Triton; emulated graphs) a cold start only means an empty graphtop cache and
a new process, and the figures are a smoke check.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the graphtop command sets it (cli/entry.py)

import torch  # noqa: E402
from harness import fmt, log, md_table, percentile, shape_ckpt, write_json  # noqa: E402
from host_sampler import HostSampler, explain  # noqa: E402

from graphtop.cli.workload import DEFAULT_OUTPUT_LEN, DEFAULT_PROMPT_LEN, for_engine, sampling_params  # noqa: E402
from graphtop.engine.config import EngineConfig  # noqa: E402
from graphtop.engine.engine import Engine  # noqa: E402
from graphtop.engine.graphs.config import GraphConfig  # noqa: E402
from graphtop.engine.kernel_config import ENV as KERNEL_ENV  # noqa: E402
from graphtop.engine.kernel_config import KernelConfig  # noqa: E402
from graphtop.engine.telemetry import events as ev  # noqa: E402
from graphtop.engine.telemetry.bus import EventBus  # noqa: E402

SHAPE_NAMES = ("tiny", "qwen3-0.6b", "llama-3.1-8b")
MODES = ("cold", "warm", "off")
HOST_LIMIT_MS = 50.0
CHILD_TIMEOUT_S = 3600
EVENT_TYPES = {"step", "capture_finished", "request_first_token", "request_finished"}
CPU_NOTE = (
    "cpu: no Triton, so a cold start only means an empty graphtop cache and a new process; graphs are "
    "emulated and the figures are a smoke check, not the GPU's"
)


# -- one start (the child) -----------------------------------------------------------------------------------


def engine_settings(device: str, mode: str, cache: str, record_in_flight: bool = False) -> EngineConfig:
    """The default settings, on ``cache``; ``off`` compiles kernels during capture; ``record_in_flight``:
    recordings ride in-flight steps (``GraphConfig.record_in_flight``)."""
    return EngineConfig(
        device=device,
        cache_dir=cache,
        kernels=KernelConfig(precompile="off" if mode == "off" else "auto"),
        graphs=GraphConfig(record_in_flight=record_in_flight),
    )


def cache_files(cache: str) -> int:
    """Files under ``cache`` (what an earlier start left there)."""
    return sum(len(files) for _, _, files in os.walk(cache))


@dataclass
class Served:
    """What stepping the burst to the end brought: every event, the burst's window and its tokens."""

    events: list[ev.Event]
    burst_s: float
    output_tokens: int
    dropped: int


def serve_burst(engine: Engine, sub: Any, n: int, seed: int, prompt_len: str, output_len: str) -> Served:
    """Submit the synthetic burst at once and step until every request finished and every graph is live."""
    requests = for_engine(engine, n, seed, prompt_len=prompt_len, output_len=output_len).requests()
    t0 = time.perf_counter()
    handles = [
        engine.submit(r.prompt_token_ids, sampling_params(r, seed), request_id=f"syn-{r.index}") for r in requests
    ]
    events: list[ev.Event] = []
    finished, end = 0, None
    while engine.step():
        batch = sub.drain()
        events.extend(batch)
        if end is None:
            finished += sum(1 for e in batch if e.type == "request_finished")
            end = time.perf_counter() if finished >= len(handles) else None
    events.extend(sub.drain())
    end = end if end is not None else time.perf_counter()
    return Served(events, end - t0, sum(len(h.token_ids) for h in handles), sub.dropped)


def of_type(events: Sequence[ev.Event], kind: str) -> list[Any]:
    return [e for e in events if e.type == kind]


def live_at(events: Sequence[ev.Event], loaded: float) -> float:
    """Wall time (``time.time``) the last phase's capture finished; ``loaded`` if none was pending."""
    return max([loaded] + [e.ts for e in of_type(events, "capture_finished")])


def step_path(step: ev.StepEvent) -> str:
    """``graph``, or why the step ran eagerly."""
    return "graph" if step.path == "graph" else step.fallback_reason or "eager"


def launch_ms(step: ev.StepEvent) -> float:
    """The host time the GPU waited on for ``step`` (``host_ms`` in traces from before ``launch_ms``)."""
    return step.launch_ms if step.launch_ms is not None else step.host_ms


def host_figures(steps: Sequence[ev.StepEvent]) -> dict[str, Any]:
    """Worst and p99 launch ms of ``steps`` and how many were over the limit."""
    host = [launch_ms(s) for s in steps]
    return dict(
        host_max_ms=max(host) if host else None,
        host_p99_ms=percentile(host, 99),
        host_over_limit=sum(1 for h in host if h > HOST_LIMIT_MS),
        steps_capturing=len(host),
    )


def gpu_step_ms(step: Any) -> Optional[float]:
    """A step's GPU time: its graph replay, or its eager forward (None where not measured)."""
    return step.replay_ms if step.replay_ms is not None else getattr(step, "forward_ms", None)


def throughput_figures(served: Served) -> dict[str, Any]:
    """Output tok/s, Σ GPU step time and their ratio, TTFT percentiles."""
    steps = of_type(served.events, "step")
    gpu_ms = sum(gpu_step_ms(s) or 0.0 for s in steps)
    tok_s = served.output_tokens / served.burst_s if served.burst_s > 0 else None
    ideal = served.output_tokens / (gpu_ms / 1e3) if gpu_ms > 0 else None
    ttft = [e.ttft_ms for e in of_type(served.events, "request_first_token")]
    return dict(
        output_tokens=served.output_tokens,
        burst_s=served.burst_s,
        output_tok_s=tok_s,
        gpu_step_s=gpu_ms / 1e3,
        untimed_steps=sum(1 for s in steps if gpu_step_ms(s) is None),
        gpu_ratio=tok_s / ideal if tok_s is not None and ideal else None,
        ttft_p50_ms=percentile(ttft, 50),
        ttft_p99_ms=percentile(ttft, 99),
    )


def compile_figures(engine: Engine) -> Optional[dict[str, Any]]:
    """What the kernel compiler did (None without one: no CUDA, or precompile off)."""
    compiler = engine.model_runner.compiler
    if compiler is None:
        return None
    stats = asdict(compiler.stats)
    stats["failures"] = stats["failures"][:3]
    return stats


@dataclass
class StepWindows:
    """With ``--explain``: each step's own window on the host (the capture slice before it and its launch,
    ``StepLoop._forward``) and each capture slice's, wall time, to find the long ones' causes in the
    sampler's stacks."""

    forwards: list[tuple[float, float, str]] = field(default_factory=list)
    slices: list[tuple[float, float]] = field(default_factory=list)

    def watch(self, engine: Engine) -> None:
        loop, runner = engine.loop, engine.model_runner
        forward, advance = loop._forward, runner.advance_capture

        def timed_forward(batch: Any, **kw: Any) -> Any:
            t0 = time.time()
            try:
                return forward(batch, **kw)
            finally:
                what = f"{batch.mode.name.lower()} bs {batch.batch_size}, {batch.num_tokens} tokens"
                self.forwards.append((t0, time.time(), what))

        def timed_advance(**kw: Any) -> Any:
            t0 = time.time()
            try:
                return advance(**kw)
            finally:
                self.slices.append((t0, time.time()))

        loop._forward = timed_forward  # type: ignore[method-assign]
        runner.advance_capture = timed_advance  # type: ignore[method-assign]

    def report(self, sampler: HostSampler, top: int) -> list[str]:
        """The ``top`` longest steps over the limit, each with its slice's share and its stacks."""
        slow = sorted(self.forwards, key=lambda f: f[0] - f[1])[:top]
        lines = []
        for t0, t1, what in slow:
            if (t1 - t0) * 1e3 <= HOST_LIMIT_MS:
                break
            in_slice = sum(min(t1, b) - max(t0, a) for a, b in self.slices if b > t0 and a < t1)
            lines.append(f"  {what}: {(t1 - t0) * 1e3:.1f} ms, of which capture slice {in_slice * 1e3:.1f} ms")
            lines.extend(explain(sampler, t0, t1))
        return lines


def one_start(
    shape: str,
    device: str,
    mode: str,
    cache: str,
    n: int,
    seed: int,
    prompt_len: str,
    output_len: str,
    explain_top: int = 0,
    record_in_flight: bool = False,
) -> dict:
    """Build the engine, serve the burst, and say what it cost (``explain_top``: and where the longest
    steps' host time went)."""
    found = cache_files(cache)
    t = time.perf_counter()
    ckpt = shape_ckpt(shape, device)
    weights_s = time.perf_counter() - t
    bus = EventBus()
    sub = bus.subscribe("cold-start", maxsize=1_000_000, types=EVENT_TYPES)
    t = time.perf_counter()
    engine = Engine(ckpt, engine_settings(device, mode, cache, record_in_flight), bus)
    load_s, loaded = time.perf_counter() - t, time.time()
    windows, sampler = StepWindows(), None
    if explain_top:
        windows.watch(engine)
        sampler = HostSampler(threading.get_ident()).start()
    try:
        served = serve_burst(engine, sub, n, seed, prompt_len, output_len)
        if sampler is not None:
            sampler.stop()
            log(f"{shape} · {mode}: the longest steps while capturing, and where their host time went")
            for line in windows.report(sampler, explain_top):
                log(line)
        kernels = compile_figures(engine)
        buckets = (len(engine.decode_buckets), len(engine.prefill_buckets))
        device_name = engine.info.device_name
    finally:
        engine.close()
    live = live_at(served.events, loaded)
    steps = of_type(served.events, "step")
    capturing = [s for s in steps if s.ts - s.host_ms / 1e3 <= live] if live > loaded else []
    return dict(
        shape=shape,
        mode=mode,
        record_in_flight=record_in_flight,
        device=device,
        device_name=device_name,
        requests=n,
        cache_files_before=found,
        weights_s=weights_s,
        load_s=load_s,
        live_s=live - loaded,
        start_to_live_s=load_s + live - loaded,
        buckets=dict(decode=buckets[0], prefill=buckets[1]),
        capture_s={e.phase: e.seconds for e in of_type(served.events, "capture_finished")},
        steps=len(steps),
        paths=dict(Counter(step_path(s) for s in steps).most_common()),
        kernels=kernels,
        dropped_events=served.dropped,
        **host_figures(capturing),
        **throughput_figures(served),
    )


def child_main(args: argparse.Namespace) -> int:
    result = one_start(
        args.shape,
        args.device,
        args.child,
        args.cache,
        args.requests,
        args.seed,
        args.prompt_len,
        args.output_len,
        args.explain,
        args.record_in_flight,
    )
    Path(args.result).write_text(json.dumps(result))
    return 0


# -- the runs (the parent) -------------------------------------------------------------------------------


def child_env(cache: Path) -> dict[str, str]:
    """The environment of a start on ``cache``: graphtop's cache there, Triton's inside it, and no
    precompile override (the mode decides)."""
    env = dict(os.environ, GRAPHTOP_CACHE_DIR=str(cache))
    env.pop("TRITON_CACHE_DIR", None)
    env.pop(KERNEL_ENV["precompile"], None)
    return env


def run_start(args: argparse.Namespace, shape: str, mode: str, cache: Path) -> dict:
    """One start in a new process; its result, or a row that says how it failed."""
    cache.mkdir(parents=True, exist_ok=True)
    result = cache.parent / f"{mode}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", mode, "--cache", str(cache)]
    cmd += ["--result", str(result), "--shape", shape, "--device", args.device, "--requests", str(args.requests)]
    cmd += ["--seed", str(args.seed), "--prompt-len", args.prompt_len, "--output-len", args.output_len]
    cmd += ["--explain", str(args.explain)] + (["--record-in-flight"] if args.record_in_flight else [])
    log(f"{shape} · {mode} start ({args.requests} requests, cache {cache})")
    t = time.perf_counter()
    try:
        rc = subprocess.run(cmd, env=child_env(cache), timeout=CHILD_TIMEOUT_S).returncode
    except subprocess.TimeoutExpired:
        return dict(shape=shape, mode=mode, error=f"the child ran past {CHILD_TIMEOUT_S} s")
    if rc != 0 or not result.is_file():
        return dict(shape=shape, mode=mode, error=f"the child exited {rc}")
    row = json.loads(result.read_text())
    row["process_s"] = time.perf_counter() - t
    return row


def modes_in_order(modes: Sequence[str]) -> list[str]:
    """The starts to run, in order: a warm start needs the cold one before it."""
    wanted = set(modes) | ({"cold"} if "warm" in modes else set())
    return [m for m in MODES if m in wanted]


def run_shape(args: argparse.Namespace, shape: str, root: Path) -> list[dict]:
    caches = {"cold": root / shape / "cache", "warm": root / shape / "cache", "off": root / shape / "cache-off"}
    return [run_start(args, shape, mode, caches[mode]) for mode in modes_in_order(args.modes)]


# -- targets and the table ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    mode: str
    shapes: tuple[str, ...]
    what: str
    field: str
    limit: float
    at_least: bool = False

    def check(self, row: dict) -> Optional[dict]:
        """The target against ``row``; None where it does not apply."""
        if row.get("error") or row["mode"] != self.mode or row["shape"] not in self.shapes:
            return None
        value = row.get(self.field)
        met = value is not None and (value >= self.limit if self.at_least else value <= self.limit)
        sign = ">=" if self.at_least else "<="
        return dict(
            shape=row["shape"], mode=self.mode, what=self.what, value=value, limit=f"{sign} {self.limit:g}", met=met
        )


PUBLISHED = ("qwen3-0.6b", "llama-3.1-8b")
TARGETS = (
    Target("cold", PUBLISHED, "worst step launch ms while capturing", "host_max_ms", HOST_LIMIT_MS),
    Target("cold", ("llama-3.1-8b",), "s from load to all graphs live", "live_s", 10.0),
    Target("warm", PUBLISHED, "s from start to all graphs live", "start_to_live_s", 3.0),
    Target("cold", ("llama-3.1-8b",), "output tok/s ÷ (tokens ÷ Σ GPU step time)", "gpu_ratio", 0.8, True),
    Target("warm", ("llama-3.1-8b",), "output tok/s ÷ (tokens ÷ Σ GPU step time)", "gpu_ratio", 0.9, True),
)


def target_checks(rows: Sequence[dict]) -> list[dict]:
    return [c for row in rows for t in TARGETS if (c := t.check(row)) is not None]


def paths_text(paths: dict[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in paths.items()) or "–"


def table_row(r: dict) -> list[str]:
    if r.get("error"):
        return [r["shape"], r["mode"], r["error"]] + [""] * 7
    host = f"{fmt(r['host_max_ms'], '.1f')} / {fmt(r['host_p99_ms'], '.1f')} ({r['host_over_limit']})"
    return [
        r["shape"],
        r["mode"] + (", recording in flight" if r.get("record_in_flight") else ""),
        f"{r['load_s']:.2f}",
        f"{r['live_s']:.2f} ({r['start_to_live_s']:.2f})",
        host,
        paths_text(r["paths"]),
        f"{fmt(r['ttft_p50_ms'], '.0f')} / {fmt(r['ttft_p99_ms'], '.0f')}",
        fmt(r["output_tok_s"], ".1f"),
        f"{r['gpu_step_s']:.2f}",
        fmt(r["gpu_ratio"], ".3f"),
    ]


HEADER = [
    "shape",
    "start",
    "load s",
    "graphs live s after load (from start)",
    f"step launch ms while capturing: worst / p99 (> {HOST_LIMIT_MS:g} ms)",
    "steps by path",
    "TTFT p50 / p99 ms",
    "output tok/s",
    "Σ GPU step s",
    "tok/s ÷ (tokens ÷ Σ GPU)",
]


def print_checks(checks: Sequence[dict]) -> None:
    for c in checks:
        verdict = "met" if c["met"] else "MISSED"
        log(f"target {c['shape']} {c['mode']}: {c['what']} {fmt(c['value'], '.3f')} ({c['limit']}): {verdict}")


# -- the command --------------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cuda = torch.cuda.is_available()
    ap.add_argument(
        "--shape", help=f"comma-separated, of {', '.join(SHAPE_NAMES)} (default: llama-3.1-8b on cuda, tiny on cpu)"
    )
    ap.add_argument("--device", default="cuda" if cuda else "cpu", choices=("cuda", "cpu"))
    ap.add_argument("--requests", type=int, help="the burst (default: 1000 on cuda, 8 on cpu)")
    ap.add_argument("--modes", default="cold,warm", help="comma-separated starts: cold, warm, off (default cold,warm)")
    ap.add_argument("--prompt-len", default=DEFAULT_PROMPT_LEN, help="synthetic prompt lengths (graphtop's default)")
    ap.add_argument("--output-len", default=DEFAULT_OUTPUT_LEN, help="synthetic output lengths (graphtop's default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="folder for cold_start.json")
    ap.add_argument(
        "--record-in-flight",
        action="store_true",
        help="graphs are recorded while a step is on the device, only warmup forwards between steps "
        "(GraphConfig.record_in_flight; the A/B against the default)",
    )
    ap.add_argument(
        "--explain",
        type=int,
        default=0,
        metavar="N",
        help="sample the stepping thread's stack and print where the N longest steps over the limit went "
        "(the sampler perturbs the figures: for finding causes)",
    )
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)  # one start, in this process
    ap.add_argument("--cache", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    return ap


def checked_args(ap: argparse.ArgumentParser, argv: Optional[list[str]]) -> argparse.Namespace:
    args = ap.parse_args(argv)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        ap.error("--device cuda needs a CUDA device (--device cpu is a smoke check)")
    args.shapes = [s for s in (args.shape or ("llama-3.1-8b" if cuda else "tiny")).split(",") if s]
    args.shape = args.shapes[0]
    if unknown := [s for s in args.shapes if s not in SHAPE_NAMES]:
        ap.error(f"--shape {','.join(unknown)}: use {', '.join(SHAPE_NAMES)}")
    args.modes = [m for m in args.modes.split(",") if m]
    if not args.modes or (unknown := [m for m in args.modes if m not in MODES]):
        ap.error(f"--modes {','.join(args.modes)}: use some of {', '.join(MODES)}")
    args.requests = args.requests if args.requests is not None else (1000 if cuda else 8)
    if args.requests < 1:
        ap.error("--requests must be at least 1")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = checked_args(parser(), argv)
    if args.child:
        return child_main(args)
    with tempfile.TemporaryDirectory(prefix="graphtop-coldstart-") as root:
        rows = [row for shape in args.shapes for row in run_shape(args, shape, Path(root))]
    note = CPU_NOTE if args.device == "cpu" else None
    checks = target_checks(rows) if args.device == "cuda" else []
    print(md_table(HEADER, [table_row(r) for r in rows]))
    if note:
        log(note)
    print_checks(checks)
    if args.out:
        data = dict(device=args.device, requests=args.requests, prompt_len=args.prompt_len, output_len=args.output_len)
        log("wrote", write_json(args.out, "cold_start.json", dict(data, note=note, starts=rows, targets=checks)))
    return 1 if any(r.get("error") for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
