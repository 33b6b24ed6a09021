"""Dashboard overhead: decode tokens/s with the Textual dashboard attached ÷ headless, side by side.

    python bench/dashboard_bench.py --out OUT_DIR [--shape qwen3-0.6b] [--bs 64] [--tokens 256] [--rounds 3]

The same engine serves the same workload (bs requests × tokens new tokens, greedy, ignore_eos) from its
background thread, alternately with nobody watching and with the full dashboard running headless in
this process (15 Hz event drain, every panel live, device polling on). Rounds are interleaved and the
medians compared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402

from graphtop.engine.config import EngineConfig  # noqa: E402
from graphtop.engine.engine import Engine  # noqa: E402
from graphtop.engine.sampling_params import SamplingParams  # noqa: E402
from graphtop.models.random_model import hf_config_for, random_checkpoint  # noqa: E402


def workload(engine: Engine, bs: int, tokens: int, seed: int) -> float:
    """Serve bs requests to completion on the engine's own thread; return decode tokens/s."""
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


async def with_dashboard(engine: Engine, bs: int, tokens: int, seed: int) -> float:
    from graphtop.tui.app import GraphtopApp
    from graphtop.tui.session import EngineSession

    session = EngineSession("<bench>", None, engine_factory=lambda path, cfg, bus: _rebind(engine, bus))
    app = GraphtopApp(session, poll_device=True)
    async with app.run_test(size=(200, 60)) as pilot:
        while not app.engine_ready:
            await pilot.pause(0.05)
        loop = asyncio.get_running_loop()
        rate = await loop.run_in_executor(None, workload, engine, bs, tokens, seed)
        await pilot.pause(0.2)
        assert app.state.total_steps > 0, "the dashboard saw the steps"
    engine.shutdown()
    return rate


def _rebind(engine: Engine, bus) -> Engine:
    """Point the running engine at the dashboard's bus (the engine publishes to whatever bus it holds)."""
    engine.bus = bus
    return engine


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    ap.add_argument("--shape", default="qwen3-0.6b")
    ap.add_argument("--bs", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cuda", help="cuda (the measurement) or cpu (a smoke run)")
    ap.add_argument("--layers", type=int, default=0, help="override the layer count (smoke runs)")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("dashboard_bench: needs a CUDA device (or --device cpu for a smoke run)", file=sys.stderr)
        return 2
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    overrides = {"num_hidden_layers": args.layers} if args.layers else {}
    ckpt = random_checkpoint(hf_config_for(args.shape, **overrides), device=args.device, dtype=dtype)
    from graphtop.engine.telemetry.bus import EventBus

    engine = Engine(ckpt, EngineConfig(device=args.device, dtype=str(dtype).replace("torch.", ""),
                                       max_context_len=1024, max_total_tokens=args.bs * 512,
                                       capture_before_serving=True), EventBus())
    engine.start_background()
    workload(engine, args.bs, 16, seed=99)  # warm up
    headless, dashboard = [], []
    for r in range(args.rounds):
        engine.bus = EventBus()
        engine.start_background()
        headless.append(workload(engine, args.bs, args.tokens, seed=r))
        engine.shutdown()
        dashboard.append(asyncio.run(with_dashboard(engine, args.bs, args.tokens, seed=r)))
        print(f"round {r}: headless {headless[-1]:.0f} tok/s, dashboard {dashboard[-1]:.0f} tok/s", flush=True)
    res = {"shape": args.shape, "bs": args.bs, "tokens": args.tokens, "headless_tok_s": headless,
           "dashboard_tok_s": dashboard,
           "ratio": statistics.median(dashboard) / statistics.median(headless)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "dashboard_bench.json").write_text(json.dumps(res, indent=1))
    print(f"dashboard/headless decode tokens/s ({args.shape}, bs {args.bs}): "
          f"{statistics.median(dashboard):.0f} / {statistics.median(headless):.0f} = {res['ratio']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
