"""What the HTTP API costs: one synthetic workload served through ``graphtop serve``'s API and through the
Python API of the same engine, in one run, with the ratio.

The workload is the synthetic one of ``graphtop --synthetic`` (cli/workload.py): seeded token-id prompts,
prompt and output lengths from distributions, Poisson arrivals. Every request asks for exactly its output
length (``ignore_eos``), greedily. Through HTTP an async client (httpx, in a process of its own) streams each
request from ``/v1/completions``; through the Python API the same requests are submitted at the same arrival
times and their tokens timed by ``on_update``. Both report output tokens/s over the serving window, TTFT and
the inter-token latency (per stream chunk through HTTP, per token through the API) at p50 and p99.

Options: --model PATH or --shape llama-3.1-8b (random weights; ``tiny`` is a CPU-sized one), --requests,
--rate, --prompt-len, --output-len, --device, --json OUT.json. On an H200, the 8B shape:

    python3 bench/serve_bench.py --shape llama-3.1-8b --device cuda --requests 200 --rate 20

CPU smoke test (the demo model): python3 bench/serve_bench.py --device cpu --requests 8 --rate 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Optional

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the graphtop command sets it (cli/entry.py)


@dataclass
class Timing:
    """One request: when it was sent, when each token (or chunk) came, how many tokens it made."""

    sent: float
    arrivals: list[float] = field(default_factory=list)
    tokens: int = 0
    prompt: tuple[int, ...] = ()


@dataclass
class Report:
    path: str
    requests: int
    output_tokens: int
    seconds: float
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    pos = (len(values) - 1) * q / 100
    lo, hi = int(pos), min(int(pos) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def report(path: str, timings: list[Timing]) -> Report:
    start = min(t.sent for t in timings)
    end = max(t.arrivals[-1] for t in timings if t.arrivals)
    tokens = sum(t.tokens for t in timings)
    ttft = [(t.arrivals[0] - t.sent) * 1e3 for t in timings if t.arrivals]
    itl = [(b - a) * 1e3 for t in timings for a, b in zip(t.arrivals, t.arrivals[1:])]
    window = end - start
    return Report(
        path,
        len(timings),
        tokens,
        window,
        tokens / window if window > 0 else 0.0,
        percentile(ttft, 50),
        percentile(ttft, 99),
        percentile(itl, 50),
        percentile(itl, 99),
    )


async def _http_one(client: Any, start: float, req: Any, model: str) -> Timing:
    await asyncio.sleep(max(0.0, start + req.arrival_s - time.perf_counter()))
    body = {
        "model": model,
        "prompt": req.prompt_token_ids,
        "max_tokens": req.max_new_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    timing = Timing(time.perf_counter(), prompt=tuple(req.prompt_token_ids))
    async with client.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise SystemExit(f"serve_bench: HTTP {response.status_code}: {(await response.aread())[:200]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                timing.tokens = chunk["usage"]["completion_tokens"]
            if chunk["choices"] and chunk["choices"][0]["text"]:
                timing.arrivals.append(time.perf_counter())
    return timing


async def run_http(url: str, requests: list[Any], model: str) -> list[Timing]:
    import httpx

    limits = httpx.Limits(max_connections=len(requests) + 8, max_keepalive_connections=len(requests) + 8)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600.0), limits=limits) as client:
        start = time.perf_counter()
        return list(await asyncio.gather(*(_http_one(client, start, r, model) for r in requests)))


def http_client_process(url: str, requests: list[Any], model: str) -> list[Timing]:
    """The HTTP load runs in a process of its own, as a real client would: in the server's process its
    event loop would take the GIL from the engine's thread and the server's, and bill the API for it."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_run_http_sync, url, requests, model).result()


def _run_http_sync(url: str, requests: list[Any], model: str) -> list[Timing]:
    return asyncio.run(run_http(url, requests, model))


def run_api(engine: Any, requests: list[Any]) -> list[Timing]:
    """The same arrivals through ``engine.submit``; ``on_update`` (engine thread) stamps each token."""
    from graphtop.engine.sampling_params import SamplingParams

    timings: list[Timing] = []
    handles = []
    start = time.perf_counter()
    for r in requests:
        time.sleep(max(0.0, start + r.arrival_s - time.perf_counter()))
        timing = Timing(time.perf_counter(), prompt=tuple(r.prompt_token_ids))

        def stamp(handle: Any, timing: Timing = timing) -> None:
            if not handle.finished:  # one call per token; the last call is the finish, which brings none
                timing.arrivals.append(time.perf_counter())

        params = SamplingParams(max_new_tokens=r.max_new_tokens, temperature=0.0, ignore_eos=True)
        handle = engine.submit(r.prompt_token_ids, params)
        handle.on_update = stamp
        timings.append(timing)
        handles.append(handle)
    for handle, timing in zip(handles, timings):
        handle.wait()
        timing.tokens = len(handle.token_ids)
    return timings


@dataclass
class Stamps:
    """Engine-side times of one request (``time.perf_counter``: CLOCK_MONOTONIC, shared by the client's
    process): when ``submit`` was called and when its first token reached the handle."""

    submit: float
    first: Optional[float] = None


def stamp_submits(engine: Any) -> dict[tuple[int, ...], Stamps]:
    """Wrap ``engine.submit`` so that each request's submit and first-token times are kept by prompt."""
    stamps: dict[tuple[int, ...], Stamps] = {}
    submit = engine.submit

    def traced(*args: Any, **kwargs: Any) -> Any:
        s = Stamps(time.perf_counter())
        handle = submit(*args, **kwargs)
        stamps[tuple(handle.prompt_ids)] = s
        push = handle._push

        def first_push(token: int, text: str) -> None:
            if s.first is None:
                s.first = time.perf_counter()
            push(token, text)

        handle._push = first_push
        return handle

    engine.submit = traced
    return stamps


def ttft_parts(timings: list[Timing], stamps: dict[tuple[int, ...], Stamps]) -> dict[str, float]:
    """Where TTFT goes, p50 of each part (ms): client send to ``submit`` (HTTP in: framing, parsing,
    validation, the event loop), ``submit`` to the first token on the engine's thread (queue, prefill),
    and that token to the client (the wake-up, SSE framing, the socket)."""
    parts: dict[str, list[float]] = {"to_submit": [], "engine": [], "to_client": []}
    for t in timings:
        s = stamps.get(t.prompt)
        if s is None or s.first is None or not t.arrivals:
            continue
        parts["to_submit"].append((s.submit - t.sent) * 1e3)
        parts["engine"].append((s.first - s.submit) * 1e3)
        parts["to_client"].append((t.arrivals[0] - s.first) * 1e3)
    return {k: percentile(v, 50) for k, v in parts.items()}


def workload(engine: Any, args: argparse.Namespace) -> list[Any]:
    from graphtop.cli.workload import for_engine

    return for_engine(
        engine, args.requests, args.seed, prompt_len=args.prompt_len, output_len=args.output_len, arrival_rate=args.rate
    ).requests()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="serve_bench.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="checkpoint folder or .gguf (default: the demo model)")
    p.add_argument(
        "--shape", help="random weights in a published shape instead (qwen3-0.6b, llama-3.1-8b; tiny: CPU-sized)"
    )
    p.add_argument("--device", default="auto")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--rate", type=float, default=20.0, help="Poisson arrivals, requests/s (0: all at once)")
    p.add_argument("--prompt-len", default="uniform:16:256")
    p.add_argument("--output-len", default="uniform:16:128")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-running-requests", type=int)
    p.add_argument("--warmup", type=int, default=4, help="requests served (both ways) before timing")
    p.add_argument("--json", help="write both reports and the ratios here")
    p.add_argument(
        "--explain",
        type=int,
        default=0,
        metavar="N",
        help="sample the server's and the engine's threads over the HTTP run and print their N top stacks "
        "(the sampler perturbs the figures: for finding causes)",
    )
    return p


def main(argv: Optional[list[str]] = None) -> int:
    args = parser().parse_args(argv)
    if args.rate == 0:
        args.rate = None
    from graphtop.engine import Engine, EngineConfig
    from graphtop.server import ApiServer, ServeOptions

    if args.explain:
        from host_sampler import explain

    config = EngineConfig(
        device=args.device, max_running_requests=args.max_running_requests, capture_before_serving=True
    )
    if args.shape:
        from harness import shape_ckpt

        device = args.device if args.device != "auto" else "cuda"
        engine = Engine(shape_ckpt(args.shape, device), replace(config, device=device))
    else:
        engine = Engine.from_pretrained(args.model, config=config)
    engine.start_background()
    server = ApiServer(engine, ServeOptions(port=0, model_name="bench", max_queued_requests=None)).start()
    try:
        requests = workload(engine, args)
        warm = requests[: args.warmup]
        http_client_process(server.url, [_at_zero(r) for r in warm], "bench")
        run_api(engine, [_at_zero(r) for r in warm])
        stamps = stamp_submits(engine)
        samplers = thread_samplers(("graphtop-api", "graphtop-engine")) if args.explain else []
        http_timings = http_client_process(server.url, requests, "bench")
        for sampler in samplers:
            sampler.stop()
        http_parts = ttft_parts(http_timings, stamps)
        api_timings = run_api(engine, requests)
        api_parts = ttft_parts(api_timings, stamps)
        http, api = report("http", http_timings), report("python-api", api_timings)
    finally:
        server.close()
        engine.close()
    print(
        f"{len(requests)} requests, prompt {args.prompt_len}, output {args.output_len}, "
        f"{'all at once' if args.rate is None else f'Poisson {args.rate:g} req/s'}, device {engine.info.device}"
    )
    print(f"{'path':<12}{'tok/s':>10}{'TTFT p50':>11}{'TTFT p99':>11}{'ITL p50':>10}{'ITL p99':>10}  (ms)")
    for r in (http, api):
        print(
            f"{r.path:<12}{r.tokens_per_s:>10.1f}{r.ttft_p50_ms:>11.2f}{r.ttft_p99_ms:>11.2f}"
            f"{r.itl_p50_ms:>10.2f}{r.itl_p99_ms:>10.2f}"
        )
    for name, parts in (("http", http_parts), ("python-api", api_parts)):
        print(f"TTFT p50 parts, {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in parts.items()) + " (ms)")
    for name, sampler in zip(("the server's event loop", "the engine's thread"), samplers):
        print(f"where {name}'s time went over the HTTP run (sampled; top {args.explain} stacks):")
        for line in explain(sampler, 0.0, float("inf"), top=args.explain, frames=7):
            print(line)
    ratios = {
        "tokens_per_s": http.tokens_per_s / api.tokens_per_s if api.tokens_per_s else float("nan"),
        "ttft_p50": http.ttft_p50_ms / api.ttft_p50_ms if api.ttft_p50_ms else float("nan"),
    }
    print(f"HTTP ÷ Python API: throughput {ratios['tokens_per_s']:.3f}×, TTFT p50 {ratios['ttft_p50']:.3f}×")
    if http.output_tokens != api.output_tokens:
        print(f"serve_bench: the two paths made {http.output_tokens} and {api.output_tokens} tokens", file=sys.stderr)
        return 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "http": asdict(http),
                    "python_api": asdict(api),
                    "ratio": ratios,
                    "ttft_parts_p50_ms": {"http": http_parts, "python_api": api_parts},
                },
                f,
                indent=2,
            )
    return 0


def thread_samplers(names: tuple[str, ...]) -> list[Any]:
    """A stack sampler on each running thread of these names (``--explain``)."""
    import threading

    from host_sampler import HostSampler

    by_name = {t.name: t.ident for t in threading.enumerate()}
    return [HostSampler(by_name[n], depth=10).start() for n in names if by_name.get(n) is not None]


def _at_zero(req: Any) -> Any:
    return replace(req, arrival_s=0.0)


if __name__ == "__main__":
    sys.exit(main())
