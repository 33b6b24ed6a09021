"""CPU decode speed of graphtop against transformers' ``generate``, side by side in one run.

A real model (SmolLM2-135M-Instruct by default, fp32; ``scripts/fetch_smollm2.py`` fetches it) is
served by transformers' ``generate`` at batch 1 and by graphtop engines (one per variant: eager, and
emulated graphs) at batch 1 and with ``--inflight`` requests at once (continuous batching). Timing
rounds interleave every contestant, so load from other processes on the machine hits all of them
alike; the figures are medians over rounds. A decode rate counts tokens after each request's first
one, from the moment every request has its first token (prefill done) to the last token.

    python3 bench/cpu_bench.py [--model DIR|FILE.gguf] [--rounds 5] [--new-tokens 32] [--inflight 16]
        [--variants eager,graphs] [--threads N] [--json OUT.json]

Targets: graphtop bs 1 >= transformers bs 1; graphtop at 16 in flight >= 4x transformers bs 1. Load and
capture times on the CPU: bench/time_to_graphs.py.
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
from harness import checkpoint_folder, interleaved, log, smollm2_gguf, write_json  # noqa: E402

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
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    result = run_speed(args)
    if args.json:
        write_json(Path(args.json).parent, Path(args.json).name, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
