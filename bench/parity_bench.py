"""Decode throughput with online parity checks (``--parity-every N``) against without, side by side.

For each batch size two engines share one random-weight checkpoint: one with parity checks every N
graph steps, one without. Both serve the same ``bs`` requests; timing rounds of ``--steps`` decode
steps alternate between them (the order flips every round), so clock drift and context growth hit
both alike. Prints the median decode tokens/s of each and the ratio with ÷ without (the target on the
H200 is >= 0.97 at N = 64), and what the checks found (run, skipped, mismatches, worst relative error).

    python bench/parity_bench.py --device cuda [--shape qwen3-0.6b] [--batch-sizes 1,64] [--every 64]
        [--rounds 8] [--steps 256] [--attention auto] [--compare-pacing]
    python bench/parity_bench.py --device cpu   # smoke check: a CPU-sized Qwen3, emulated graphs
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402

from graphtop.engine.config import EngineConfig  # noqa: E402
from graphtop.engine.engine import Engine  # noqa: E402
from graphtop.engine.sampling_params import SamplingParams  # noqa: E402
from graphtop.engine.telemetry.bus import EventBus  # noqa: E402
from graphtop.models.synthetic.random_model import hf_config_for, random_checkpoint  # noqa: E402

PROMPT_LEN = 128
# A CPU-sized Qwen3 for the smoke check (as bench/capture_bench.py): emulated graphs, fp32.
CPU_SHAPE = dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, vocab_size=8192)


def make_engine(ckpt: Any, device: str, bs: int, context: int, every: int, attention: str) -> Engine:
    cfg = EngineConfig(device=device, dtype="bfloat16" if device == "cuda" else "float32", attention_backend=attention,
                       page_size=1, chunked_prefill_size=1024, max_running_requests=bs, max_context_len=context,
                       max_total_tokens=bs * context + 4096, parity_every=every)
    return Engine(ckpt, cfg, EventBus())


def fill_decode(eng: Engine, bs: int, new_tokens: int) -> list:
    g = torch.Generator().manual_seed(bs)
    vocab = eng.spec.vocab_size
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True, detokenize=False)
    handles = [eng.submit(torch.randint(10, vocab - 10, (PROMPT_LEN,), generator=g).tolist(), params)
               for _ in range(bs)]
    while any(len(h._token_ids) == 0 for h in handles):  # through the prefills
        eng.step()
    return handles


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def tokens_per_s(eng: Engine, bs: int, steps: int, device: str) -> float:
    sync(device)
    t = time.perf_counter()
    for _ in range(steps):
        eng.step()
    sync(device)
    return bs * steps / (time.perf_counter() - t)


def run_batch_size(ckpt: Any, args: argparse.Namespace, bs: int) -> dict[str, float]:
    new_tokens = (args.rounds + 1) * args.steps + 8
    context = PROMPT_LEN + new_tokens + 16
    engines = {"without": make_engine(ckpt, args.device, bs, context, 0, args.attention),
               "with": make_engine(ckpt, args.device, bs, context, args.every, args.attention)}
    if args.compare_pacing:  # the same checks with the re-run's pacing off (engine/parity/checker.py)
        engines["unpaced"] = make_engine(ckpt, args.device, bs, context, args.every, args.attention)
        engines["unpaced"].parity.pacing = False
    handles = {name: fill_decode(eng, bs, new_tokens) for name, eng in engines.items()}
    for eng in engines.values():  # warm up, checks included (the first eager re-run compiles its kernels)
        tokens_per_s(eng, bs, args.steps, args.device)
    checkers = {name: eng.parity for name, eng in engines.items() if name != "without"}
    before = {}
    for name, checker in checkers.items():
        checker.wait_idle()
        before[name] = (checker.checks, checker.skipped)
    rates: dict[str, list[float]] = {name: [] for name in engines}
    for r in range(args.rounds):
        order = list(engines) if r % 2 == 0 else list(reversed(engines))
        for name in order:
            rates[name].append(tokens_per_s(engines[name], bs, args.steps, args.device))
    out = {name: statistics.median(v) for name, v in rates.items()}
    result: dict[str, float] = {"bs": bs, "without_tok_s": out["without"]}
    for name, checker in checkers.items():
        checker.wait_idle()
        checks, skipped = checker.checks - before[name][0], checker.skipped - before[name][1]
        ratio = out[name] / out["without"]
        label = f"with (1 in {args.every})" if name == "with" else f"{name} (1 in {args.every})"
        print(f"bs {bs:>3}: without {out['without']:10.1f} tok/s   {label} {out[name]:10.1f} tok/s"
              f"   {name} ÷ without {ratio:.3f}   (medians of {args.rounds} rounds × {args.steps} steps;"
              f" rounds {min(rates[name]) / max(rates['without']):.3f}–{max(rates[name]) / min(rates['without']):.3f})",
              flush=True)
        print(f"        checks run {checks}, skipped {skipped} (one still running), mismatches {checker.mismatches},"
              f" worst rel err {checker.worst_rel_err:.3g} (tolerance {checker.tolerance:g})", flush=True)
        result[f"{name}_tok_s"], result[f"{name}_ratio"] = out[name], ratio
        if name == "with":
            result.update(with_tok_s=out[name], ratio=ratio, checks=checks, skipped=skipped)
    for name, eng in engines.items():
        for h in handles[name]:
            eng.cancel(h.request_id)
        eng.run_until_idle()
        eng.close()
    del engines, handles
    gc.collect()
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shape", default="qwen3-0.6b")
    ap.add_argument("--batch-sizes", default=None, help="default 1,64 (CUDA) or 1,8 (CPU)")
    ap.add_argument("--every", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=None, help="default 8 (CUDA) or 3 (CPU)")
    ap.add_argument("--steps", type=int, default=None, help="steps per timing round; default 256 (CUDA) or 64 (CPU)")
    ap.add_argument("--attention", default="auto", choices=["auto", "flashinfer", "torch"])
    ap.add_argument("--compare-pacing", action="store_true",
                    help="also time an engine whose parity re-run is not paced (its Python competes freely)")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    args.rounds = args.rounds or (8 if cuda else 3)
    args.steps = args.steps or (256 if cuda else 64)
    sizes = [int(s) for s in (args.batch_sizes or ("1,64" if cuda else "1,8")).split(",")]
    if cuda:
        ckpt = random_checkpoint(hf_config_for(args.shape), device="cuda", dtype=torch.bfloat16)
        print(f"{torch.cuda.get_device_name()} · {args.shape} (random bf16 weights) · attention {args.attention}",
              flush=True)
    else:
        torch.set_num_threads(1)
        ckpt = random_checkpoint(hf_config_for(args.shape, **CPU_SHAPE),
                                 device="cpu", dtype=torch.float32)
        print(f"cpu · {args.shape} CPU-sized, emulated graphs: a smoke check, not a throughput figure (the eager"
              " re-run competes with the engine for the same cores)", flush=True)
    results = [run_batch_size(ckpt, args, bs) for bs in sizes]
    worst = min(r["ratio"] for r in results)
    print(f"lowest with ÷ without: {worst:.3f}" + (" (target >= 0.97)" if cuda else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
