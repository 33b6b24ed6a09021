"""Dashboard overhead in the real configuration: decode tokens/s with a dashboard attached ÷ headless.

    python3 bench/dashboard_bench.py --out OUT_DIR [--configs qwen3-0.6b:1,qwen3-0.6b:64,llama-3.1-8b:1]
                                     [--tokens 512] [--rounds 5] [--device cuda|cpu] [--layers N]

For each shape:bs, one engine serves the same workload (bs requests × tokens new tokens, greedy,
ignore_eos) from its background thread, in interleaved rounds (ABBA order):

* headless: no endpoint, nobody subscribed to the bus (the engine does not even build step events);
* attached: ``engine.serve_telemetry()`` and a viewer *process* (this script with ``--viewer``) running
  the full Textual dashboard attached over the endpoint, headless-rendered at 200×60 at its normal
  rate (15 Hz timer, 4 Hz while busy, every panel live, device polling on). The viewer attaches and
  is ready before the round's clock starts, and reports how many steps it showed and how many it
  dropped after it.

The figure is median(attached) ÷ median(headless). ``--viewer-kind raw`` swaps the dashboard for a viewer
that only receives, which separates the endpoint's cost from the renderer's (on a machine with cores to
spare, the viewer process should cost the engine nothing either way).
``--device cpu --configs demo:1,demo:8 --tokens 64`` is a smoke run on the built-in demo model (no GPU needed;
the ratio means little there)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
# The viewer process imports only the dashboard (no torch, no harness): it starts in a fraction of a second.


# -- the viewer process ----------------------------------------------------------------------------


def _raw_viewer(endpoint: str, token: str) -> None:
    """A viewer that only receives and decodes (no Textual): the endpoint's own cost, without rendering."""
    import threading

    from graphtop.tui.sessions.remote import RemoteSession

    session = RemoteSession(endpoint, token, label="bench")
    session.start()
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), done.set()), daemon=True).start()
    print("ready", flush=True)
    steps = 0
    while not done.wait(1 / 15):
        steps += sum(1 for e in session.drain() if e.type == "step")
    time.sleep(0.5)
    steps += sum(1 for e in session.drain() if e.type == "step")
    print(json.dumps({"steps": steps, "dropped": session.dropped}), flush=True)
    session.shutdown()


async def _viewer(endpoint: str, token: str) -> None:
    from graphtop.tui.app import GraphtopApp
    from graphtop.tui.sessions.remote import RemoteSession

    session = RemoteSession(endpoint, token, label="bench")
    session.connect()
    app = GraphtopApp(session, poll_device=True)
    loop = asyncio.get_running_loop()
    done = loop.run_in_executor(None, sys.stdin.readline)  # the parent writes a line when the round ends
    async with app.run_test(size=(200, 60)) as pilot:
        while not app.engine_ready:
            await pilot.pause(0.05)
        print("ready", flush=True)
        await done
        await pilot.pause(0.5)  # the tail of the round's events
        steps = app.state.total_steps
        print(json.dumps({"steps": steps, "dropped": session.dropped}), flush=True)
    session.shutdown()


# -- the engine process ----------------------------------------------------------------------------


def workload(engine: Any, bs: int, tokens: int, seed: int) -> float:
    """Serve bs requests to completion on the engine's own thread; return decode tokens/s."""
    import torch

    from graphtop.engine.sampling_params import SamplingParams

    g = torch.Generator().manual_seed(seed)
    vocab = engine.spec.vocab_size
    params = SamplingParams(max_new_tokens=tokens, ignore_eos=True, detokenize=False)
    prompts = [torch.randint(10, vocab - 10, (128,), generator=g).tolist() for _ in range(bs)]
    t = time.perf_counter()
    handles = [engine.submit(p, params) for p in prompts]
    for h in handles:
        h.wait()
    dt = time.perf_counter() - t
    return sum(len(h.token_ids) for h in handles) / dt


def attached_round(engine: Any, bs: int, tokens: int, seed: int, runtime: Path, kind: str) -> tuple[float, dict]:
    server = engine.serve_telemetry(runtime_dir=runtime)
    viewer = subprocess.Popen(
        [sys.executable, __file__, "--viewer", kind, server.endpoint, server.token],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = viewer.stdout.readline().strip()  # type: ignore[union-attr]
        if line != "ready":
            raise RuntimeError(f"the viewer did not start: {line!r}")
        steps0 = engine.loop.step_no
        rate = workload(engine, bs, tokens, seed)
        steps = engine.loop.step_no - steps0
        viewer.stdin.write("done\n")  # type: ignore[union-attr]
        viewer.stdin.flush()  # type: ignore[union-attr]
        report = json.loads(viewer.stdout.readline())  # type: ignore[union-attr]
        viewer.wait(60)
    finally:
        if viewer.poll() is None:
            viewer.kill()
        server.close()
        engine.telemetry = None
    report["engine_steps"] = steps
    return rate, report


def bench_config(shape: str, bs: int, args: argparse.Namespace, runtime: Path) -> dict:
    import torch
    from harness import interleaved, log, random_ckpt, release_cuda

    from graphtop.engine.config import EngineConfig
    from graphtop.engine.engine import Engine
    from graphtop.engine.telemetry.bus import EventBus

    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    config = EngineConfig(
        device=args.device,
        dtype=str(dtype).replace("torch.", ""),
        max_context_len=1024,
        max_total_tokens=max(bs, 8) * 1024,
    )
    if shape == "demo":  # the built-in tiny model, few buckets: a quick smoke run
        config.graphs.decode_bs, config.graphs.prefill_num_tokens = [1, 2, 4, 8, 16, 32, 64], [128, 512, 1024]
        engine = Engine.from_pretrained(None, config=config, bus=EventBus())
    else:
        overrides = {"num_hidden_layers": args.layers} if args.layers else {}
        ckpt = random_ckpt(shape, device=args.device, dtype=dtype, **overrides)
        engine = Engine(ckpt, config, EventBus())
    engine.start_background()
    try:
        workload(engine, bs, 16, seed=99)  # warm up
        attached_round(engine, bs, 16, 98, runtime, args.viewer_kind)  # and the viewer's first start (imports)
        reports: list[dict] = []
        round_no = 0  # both sides of a round serve the same prompts

        def attached_rate() -> float:
            rate, report = attached_round(engine, bs, args.tokens, round_no, runtime, args.viewer_kind)
            reports.append(report)
            return rate

        def progress(r: int, figures: dict[str, list[float]]) -> None:
            nonlocal round_no
            round_no = r + 1
            rep = reports[-1]
            log(
                f"{shape} bs {bs} round {r}: headless {figures['headless'][-1]:.0f} tok/s, attached "
                f"{figures['attached'][-1]:.0f} tok/s; viewer showed {rep['steps']} of {rep['engine_steps']} steps, "
                f"dropped {rep['dropped']}"
            )

        figures = interleaved(
            {"headless": lambda: workload(engine, bs, args.tokens, seed=round_no), "attached": attached_rate},
            args.rounds,
            abba=True,
            on_round=progress,
        )
        headless, attached = figures["headless"], figures["attached"]
    finally:
        engine.close()
        release_cuda()
    ratio = statistics.median(attached) / statistics.median(headless)
    print(
        f"dashboard attached / headless decode tokens/s ({shape}, bs {bs}): "
        f"{statistics.median(attached):.0f} / {statistics.median(headless):.0f} = {ratio:.3f}",
        flush=True,
    )
    accounted = all(r["steps"] + r["dropped"] >= r["engine_steps"] for r in reports)
    return {
        "shape": shape,
        "bs": bs,
        "tokens": args.tokens,
        "viewer_kind": args.viewer_kind,
        "headless_tok_s": headless,
        "attached_tok_s": attached,
        "viewer": reports,
        "every_step_shown_or_counted": accounted,
        "ratio": ratio,
    }


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    ap.add_argument("--configs", default="qwen3-0.6b:1,qwen3-0.6b:64,llama-3.1-8b:1", help="shape:bs,...")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--device", default="cuda", help="cuda (the measurement) or cpu (a smoke run)")
    ap.add_argument("--layers", type=int, default=0, help="override the layer count (smoke runs)")
    ap.add_argument(
        "--viewer-kind",
        choices=["dashboard", "raw"],
        default="dashboard",
        help="raw: a viewer that only receives (the endpoint's cost without rendering)",
    )
    ap.add_argument("--viewer", nargs=3, metavar=("KIND", "ENDPOINT", "TOKEN"), help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.viewer:
        kind, endpoint, token = args.viewer
        if kind == "raw":
            _raw_viewer(endpoint, token)
        else:
            asyncio.run(_viewer(endpoint, token))
        return 0
    import tempfile

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("dashboard_bench: needs a CUDA device (or --device cpu for a smoke run)", file=sys.stderr)
        return 2
    results = []
    with tempfile.TemporaryDirectory(prefix="gtb-") as runtime:
        for item in args.configs.split(","):
            shape, bs = item.rsplit(":", 1)
            results.append(bench_config(shape, int(bs), args, Path(runtime)))
    from harness import write_json

    write_json(args.out, "dashboard_bench.json", results)
    print("summary (attached ÷ headless, median of interleaved rounds):")
    for r in results:
        print(
            f"  {r['shape']:>14} bs {r['bs']:>3}: {r['ratio']:.3f}"
            f"{'' if r['every_step_shown_or_counted'] else '  (viewer lost steps without counting them!)'}"
        )
    return 0 if all(r["every_step_shown_or_counted"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
