"""What the sampling extras cost a decode step: one engine serves the same batch under each variant's
``SamplingParams`` in turn (interleaved rounds, bench/harness.py), and the median whole serving step is
printed per variant, with the share of steps the overlap schedule chained.

    python3 bench/sampling_bench.py [--shape qwen3-0.6b] [--bs 1,32] [--rounds 5] [--steps 32]
        [--variants plain,neutral,penalties,bias,min_tokens,logprobs,sampled] [--device cuda|cpu] [--out DIR]

Variants: ``plain`` greedy with nothing else (the fast path: the decode graph's argmax and the overlap
schedule); ``neutral`` the same with the values vLLM's clients send when they ask for nothing
(``repetition_penalty`` 1.0, penalties 0, an empty ``logit_bias``), which must cost nothing; ``penalties``
repetition 1.1 and frequency and presence 0.1; ``bias`` a logit bias on 8 tokens; ``min_tokens`` greedy with
the end-of-sequence token held back for the whole run; ``logprobs`` 5 alternatives per token;
``sampled`` temperature 0.7 and top-p 0.9, the sampler's usual non-greedy path, for scale.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from harness import (  # noqa: E402
    CPU_SHAPE,
    MAX_CONTEXT,
    PROMPT_LEN,
    comma_ints,
    drain,
    interleaved,
    log,
    make_engine,
    md_table,
    medians,
    prefill_all,
    random_ckpt,
    release_cuda,
    sync_for,
    time_steps,
    write_json,
)

from graphtop.engine.sampling_params import SamplingParams  # noqa: E402

VARIANTS = {
    "plain": {},
    "neutral": dict(repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, logit_bias={}),
    "penalties": dict(repetition_penalty=1.1, presence_penalty=0.1, frequency_penalty=0.1),
    "bias": dict(logit_bias={t: 0.5 for t in range(100, 108)}),
    "min_tokens": dict(ignore_eos=False),  # min_tokens: the whole run (params_for)
    "logprobs": dict(logprobs=5),
    "sampled": dict(temperature=0.7, top_p=0.9),
}


def params_for(name: str, new_tokens: int) -> SamplingParams:
    fields = dict(max_new_tokens=new_tokens, ignore_eos=True, detokenize=False)
    fields.update(VARIANTS[name])
    if name == "min_tokens":
        fields["min_tokens"] = new_tokens
    return SamplingParams(**fields)


def timed(eng, bs: int, params: SamplingParams, steps: int, device: str) -> tuple[float, float]:
    """(ms a whole serving step over ``steps`` decode steps of ``bs`` rows, the share of those steps the
    overlap schedule chained)."""
    g = torch.Generator().manual_seed(0)
    vocab = eng.spec.vocab_size
    handles = [
        eng.submit(torch.randint(10, vocab - 10, (PROMPT_LEN,), generator=g).tolist(), params) for _ in range(bs)
    ]
    prefill_all(eng, handles)
    before = eng.loop.overlapped_steps
    ms = time_steps(eng, steps, sync_for(device))
    chained = (eng.loop.overlapped_steps - before) / steps
    drain(eng, handles)
    return ms, chained


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-0.6b")
    ap.add_argument("--bs", type=comma_ints, default=[1, 32])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=None)
    return ap


def main(argv: Optional[list[str]] = None) -> None:
    ap = parser()
    args = ap.parse_args(argv)
    names = args.variants.split(",")
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        ap.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    cpu = args.device == "cpu"
    dtype = torch.float32 if cpu else torch.bfloat16
    ckpt = random_ckpt(args.shape, device=args.device, dtype=dtype, **(CPU_SHAPE if cpu else {}))
    eng = make_engine(ckpt, device=args.device, decode_bs=args.bs, prefill_graphs=False, max_running=max(args.bs))
    new_tokens = MAX_CONTEXT - PROMPT_LEN - 2
    rows, results = [], {}
    for bs in args.bs:
        chained: dict[str, float] = {}

        def one(name: str, bs: int = bs) -> float:
            ms, share = timed(eng, bs, params_for(name, new_tokens), args.steps, args.device)
            chained[name] = share
            return ms

        figures = interleaved({n: (lambda n=n: one(n)) for n in names}, args.rounds, abba=True)
        med = medians(figures)
        results[bs] = {n: {"ms": figures[n], "median_ms": med[n], "chained": chained[n]} for n in names}
        for n in names:
            rows.append([bs, n, f"{med[n]:.3f}", f"{med[n] / med[names[0]]:.3f}", f"{chained[n]:.2f}"])
        log(f"bs {bs}: " + ", ".join(f"{n} {med[n]:.3f} ms" for n in names))
    eng.close()
    release_cuda()
    table = md_table(["bs", "variant", "step ms (median)", f"vs {names[0]}", "chained"], rows)
    print(f"{args.shape} on {args.device} ({torch.cuda.get_device_name() if not cpu else 'cpu'})\n{table}")
    if args.out:
        write_json(args.out, "sampling_bench.json", {"shape": args.shape, "device": args.device, "results": results})


if __name__ == "__main__":
    main()
