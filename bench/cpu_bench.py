"""CPU decode speed of graphtop against transformers' ``generate``, side by side in one run.

A real model (SmolLM2-135M-Instruct by default, fp32; ``scripts/fetch_smollm2.py`` fetches it) is
served by transformers' ``generate`` at batch 1 and by graphtop engines (one per variant: eager, and
emulated graphs) at batch 1 and with ``--inflight`` requests at once (continuous batching). Timing
rounds interleave every contestant, so load from other processes on the machine hits all of them
alike; the figures are medians over rounds. A decode rate counts tokens after each request's first
one, from the moment every request has its first token (prefill done) to the last token.

    python3 bench/cpu_bench.py [--model DIR|FILE.gguf] [--rounds 5] [--new-tokens 32] [--inflight 16]
        [--variants eager,graphs] [--threads N] [--json OUT.json]
    python3 bench/cpu_bench.py --time-to-graphs [--shapes demo,smollm2-135m] [--model DIR|FILE.gguf]
        [--forward-per-bucket]

Targets: graphtop bs 1 >= transformers bs 1; graphtop at 16 in flight >= 4x transformers bs 1.

``--time-to-graphs`` measures instead how long until every graph is live on a CPU (emulated graphs), for each
of ``--shapes`` (the demo model, random-weight shapes) and ``--model`` if given, with the default engine
settings (serve while capturing, default bucket lists):

* load: checkpoint to an engine that serves (``Engine.from_pretrained``, or random weights of a
  published shape and ``Engine(...)``; torch and the engine modules are imported beforehand);
* capture: constructor return to ``wait_for_capture()`` on an idle engine, which captures flat out;
* first token: a second engine, a prompt submitted as soon as it is constructed, to its first token
  (the engine serves while it captures, so this does not wait for the capture).

Each figure is wall seconds and, in brackets, this process's CPU seconds (user + system, all threads):
on a shared machine the wall time grows with the load average, the CPU time much less.
``--forward-per-bucket`` also times one eager forward per bucket at the same lists: the work the
emulated capture did per bucket before it recorded the contract instead (minutes for SmolLM2-135M
on two cores). A ``.gguf`` ``--model`` is converted to a folder in the user cache first, untimed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

# as the graphtop command sets it (cli/entry.py); read when torch loads OpenMP, so before the harness
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from harness import checkpoint_folder, interleaved, log, md_table, random_ckpt, smollm2_gguf, write_json  # noqa: E402

from graphtop.engine.config import EngineConfig  # noqa: E402
from graphtop.engine.engine import Engine  # noqa: E402
from graphtop.engine.sampling_params import SamplingParams  # noqa: E402
from graphtop.engine.telemetry.bus import EventBus  # noqa: E402

PROMPT = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle. "
    "Describe the sea, the weather and the keeper's thoughts in detail."
)


def default_model() -> str:
    """The SmolLM2 GGUF fetched by scripts/fetch_smollm2.py, if it is there."""
    path = smollm2_gguf()
    if not path.is_file():
        raise SystemExit(f"cpu_bench: {path} not found; run `python3 scripts/fetch_smollm2.py` or pass --model")
    return str(path)


def stamp() -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds)."""
    return time.perf_counter(), time.process_time()


@dataclass(frozen=True)
class Rate:
    """Decode tokens per wall second, and per CPU second of this process. On a shared machine the
    wall rate swings with other processes' load; the CPU rate (what the work itself cost) much less."""

    wall: float
    cpu: float

    @staticmethod
    def between(tokens: int, start: tuple[float, float], end: tuple[float, float]) -> "Rate":
        return Rate(tokens / (end[0] - start[0]), tokens / max(end[1] - start[1], 1e-9))


# --- transformers ------------------------------------------------------------------------------
class HFContestant:
    """transformers' own greedy ``generate`` at batch 1; a logits processor stamps every step."""

    name = "transformers bs 1"

    def __init__(self, folder: Path, prompt_ids: list[int], new_tokens: int):
        from transformers import AutoModelForCausalLM, LogitsProcessorList

        self.model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
        self.ids = torch.tensor([prompt_ids])
        self.new_tokens = new_tokens
        self.stamps: list[tuple[float, float]] = []

        def clock(input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            self.stamps.append(stamp())
            return scores

        self.processors = LogitsProcessorList([clock])

    @torch.inference_mode()
    def rate(self) -> Rate:
        self.stamps = []
        n = self.new_tokens
        self.model.generate(
            self.ids,
            attention_mask=torch.ones_like(self.ids),
            do_sample=False,
            max_new_tokens=n,
            min_new_tokens=n,
            logits_processor=self.processors,
            pad_token_id=self.model.config.eos_token_id,
        )
        # stamp i is taken before token i is chosen: stamps[0] ends prefill, n-1 intervals decode
        return Rate.between(len(self.stamps) - 1, self.stamps[0], self.stamps[-1])


# --- graphtop ----------------------------------------------------------------------------------
def build_engine(folder: Path, variant: str, inflight: int) -> Any:
    from graphtop.engine import Engine, EngineConfig
    from graphtop.engine.graphs.config import GraphConfig

    if variant == "eager":
        graphs = GraphConfig(decode_backend="disabled", prefill_backend="disabled")
    elif variant == "graphs":  # emulated decode graphs at the sizes timed; prefill is not timed
        graphs = GraphConfig(decode_bs=sorted({1, inflight}), prefill_backend="disabled")
    else:
        raise SystemExit(f"cpu_bench: unknown variant {variant!r}; use eager or graphs")
    config = EngineConfig(device="cpu", dtype="float32", graphs=graphs, max_running_requests=max(inflight, 1))
    return Engine.from_pretrained(str(folder), config=config)


def graphtop_rate(engine: Any, prompts: list[list[int]], new_tokens: int) -> Rate:
    from graphtop.engine import SamplingParams

    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True, detokenize=False)
    handles = [engine.submit(p, params) for p in prompts]
    while not all(h.token_ids for h in handles):
        engine.step()
    start = stamp()
    engine.run_until_idle()
    return Rate.between(sum(len(h.token_ids) - 1 for h in handles), start, stamp())


def prompts_for(tokenizer: Any, n: int) -> list[list[int]]:
    """``n`` prompts of equal length (distinct first tokens), so every contestant decodes the same context."""
    base = tokenizer.encode(PROMPT)
    return [[tokenizer.encode(f" {i}")[-1]] + base for i in range(n)] if n > 1 else [base]


def run_speed(args: argparse.Namespace) -> dict:
    folder = checkpoint_folder(args.model or default_model())
    variants = [v for v in args.variants.split(",") if v]
    engines = {v: build_engine(folder, v, args.inflight) for v in variants}
    tok = next(iter(engines.values())).tokenizer
    one = prompts_for(tok, 1)
    many = prompts_for(tok, args.inflight)
    hf = HFContestant(folder, one[0], args.new_tokens)
    contestants: dict[str, Callable[[], Rate]] = {hf.name: hf.rate}
    for v, eng in engines.items():
        contestants[f"graphtop {v} bs 1"] = lambda e=eng: graphtop_rate(e, one, args.new_tokens)
        contestants[f"graphtop {v} {args.inflight} in flight"] = lambda e=eng: graphtop_rate(e, many, args.new_tokens)
    for fn in contestants.values():  # warm-up: first calls pay one-off allocation and kernel selection
        fn()

    def progress(r: int, rates: dict[str, list[Rate]]) -> None:
        log(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{n} {v[-1].wall:.1f}" for n, v in rates.items()))

    rates = interleaved(contestants, args.rounds, on_round=progress)
    print(
        f"\nSmolLM2 decode, median of {args.rounds} interleaved rounds, torch threads {torch.get_num_threads()}, "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, prompt {len(one[0])} tokens, "
        f"{args.new_tokens} new tokens, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    result: dict = {
        "threads": torch.get_num_threads(),
        "new_tokens": args.new_tokens,
        "prompt_tokens": len(one[0]),
        "inflight": args.inflight,
        "rounds": {n: [vars(x) for x in v] for n, v in rates.items()},
    }
    for metric in ("wall", "cpu"):
        med = {name: statistics.median(getattr(x, metric) for x in v) for name, v in rates.items()}
        base = med[hf.name]
        unit = "tok/s" if metric == "wall" else "tok per CPU-s"
        print(f" {metric}: decode {unit}")
        for name, v in med.items():
            print(f"  {name:36s} {v:8.1f}   {v / base:5.2f}x transformers bs 1")
        for v in variants:
            b1, bn = med[f"graphtop {v} bs 1"] / base, med[f"graphtop {v} {args.inflight} in flight"] / base
            print(
                f"  target {v}: bs 1 {b1:.2f}x (>= 1: {'met' if b1 >= 1 else 'NOT met'}), "
                f"{args.inflight} in flight {bn:.2f}x (>= 4: {'met' if bn >= 4 else 'NOT met'})"
            )
        result[f"median_{metric}"] = med
    return result


def loader(name: str) -> Callable[[EventBus], Engine]:
    """A function that builds a fresh CPU engine for ``name`` (demo, a random shape, a folder or a GGUF)."""
    config = EngineConfig(device="cpu", dtype="float32")
    if name == "demo":
        return lambda bus: Engine.from_pretrained(None, config=config, bus=bus)
    if os.path.exists(name):
        folder = str(checkpoint_folder(name))
        return lambda bus: Engine.from_pretrained(folder, config=config, bus=bus)
    return lambda bus: Engine(random_ckpt(name, device="cpu", dtype=torch.float32), config, bus)


def forward_per_bucket(engine: Engine) -> float:
    """Seconds for one eager forward at every configured bucket (what capture used to run)."""
    t0 = time.perf_counter()
    for runner in (engine.model_runner.decode, engine.model_runner.prefill):
        for size in runner.configured if runner is not None else ():
            runner._prepare_capture(size)
            runner._forward(size)
    return time.perf_counter() - t0


def measure(name: str, with_forwards: bool) -> dict[str, Any]:
    build = loader(name)
    bus = EventBus()
    sub = bus.subscribe("capture", types={"capture_finished"})
    t0, c0 = time.perf_counter(), time.process_time()
    engine = build(bus)
    t1, c1 = time.perf_counter(), time.process_time()
    assert engine.wait_for_capture(timeout=600), "capture did not finish in 10 minutes"
    t2, c2 = time.perf_counter(), time.process_time()
    phases = {e.phase: e.seconds for e in sub.drain()}
    row: dict[str, Any] = dict(
        model=os.path.basename(os.path.normpath(name)),
        load_s=t1 - t0,
        load_cpu_s=c1 - c0,
        capture_s=t2 - t1,
        capture_cpu_s=c2 - c1,
        all_live_s=t2 - t0,
        all_live_cpu_s=c2 - c0,
        decode_buckets=len(engine.decode_buckets),
        prefill_buckets=len(engine.prefill_buckets),
        decode_capture_s=phases.get("decode"),
        prefill_capture_s=phases.get("prefill"),
    )
    if with_forwards:
        row["forward_per_bucket_s"] = forward_per_bucket(engine)
    engine.close()
    del engine

    engine = build(EventBus())
    t3, c3 = time.perf_counter(), time.process_time()
    handle = engine.submit(list(range(10, 42)), SamplingParams(max_new_tokens=1, ignore_eos=True, detokenize=False))
    engine.run_until_done([handle])
    row["first_token_s"], row["first_token_cpu_s"] = time.perf_counter() - t3, time.process_time() - c3
    row["capture_pending_at_first_token"] = engine.capture_pending
    engine.close()
    return row


def time_to_graphs(args: argparse.Namespace) -> None:
    """``--time-to-graphs``: load, capture and first-token times of each model, as a table."""
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, OMP_WAIT_POLICY="
        f"{os.environ['OMP_WAIT_POLICY']}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    names = [*args.shapes.split(","), *([args.model] if args.model else [])]
    rows = [measure(name, args.forward_per_bucket) for name in names if name]
    header = [
        "model",
        "buckets decode + prefill",
        "load s",
        "capture s (decode, prefill)",
        "all graphs live s",
        "first token s",
    ] + (["one forward per bucket s"] if args.forward_per_bucket else [])
    table = []
    for r in rows:
        pending = ", capture still running" if r["capture_pending_at_first_token"] else ""
        row = [
            r["model"],
            f"{r['decode_buckets']} + {r['prefill_buckets']}",
            f"{r['load_s']:.2f} [{r['load_cpu_s']:.2f}]",
            f"{r['capture_s']:.2f} [{r['capture_cpu_s']:.2f}] ({r['decode_capture_s']:.2f}, "
            f"{r['prefill_capture_s']:.2f})",
            f"{r['all_live_s']:.2f} [{r['all_live_cpu_s']:.2f}]",
            f"{r['first_token_s']:.2f} [{r['first_token_cpu_s']:.2f}]{pending}",
        ]
        if args.forward_per_bucket:
            row.append(f"{r['forward_per_bucket_s']:.1f}")
        table.append(row)
    print(md_table(header, table))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model", help="checkpoint folder or .gguf (default: the SmolLM2 GGUF that scripts/fetch_smollm2.py fetches)"
    )
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--inflight", type=int, default=16)
    ap.add_argument("--variants", default="eager,graphs")
    ap.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's own choice)")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--time-to-graphs", action="store_true", help="only load, capture and first-token times")
    ap.add_argument(
        "--shapes",
        default="demo,smollm2-135m",
        help="--time-to-graphs: demo and/or random-weight shapes (models/synthetic/random_model.py)",
    )
    ap.add_argument("--forward-per-bucket", action="store_true", help="--time-to-graphs: one eager forward a bucket")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.time_to_graphs:
        time_to_graphs(args)
        return 0
    result = run_speed(args)
    if args.json:
        write_json(Path(args.json).parent, Path(args.json).name, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
