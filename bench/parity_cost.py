"""Where a parity check's cost goes at one batch size: a diagnostic for bench/parity_bench.py's ratio.

Three engines share one random-weight checkpoint and serve ``bs`` greedy requests, timed in
interleaved rounds: without checks; with checks every ``--every`` graph steps; and with checks whose
eager re-run is replaced by a copy of the graph's logits ("no re-run": the snapshot, hand-off, compare
and publish machinery without the eager forward); "python only" (the re-run replaced by
``--burn-ms`` of pure Python: the GIL's share); "switch 50us" (checks with a shorter switch interval). For the checking engine it also prints the step
wall time while a check is in flight against while none is, and how the worker's time splits
(attention planning, launching the forward's kernels, waiting for the comparison).

    python bench/parity_cost.py --device cuda [--shape qwen3-0.6b] [--bs 1] [--every 16] [--rounds 4]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from typing import Any

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from parity_bench import fill_decode, make_engine, sync  # noqa: E402

from graphtop.engine.runners.base import StepOutput  # noqa: E402
from graphtop.models.synthetic.random_model import hf_config_for, random_checkpoint  # noqa: E402


def timed(store: list[float], fn: Any) -> Any:
    def wrapper(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            store.append((time.perf_counter() - t) * 1e3)
    return wrapper


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shape", default="qwen3-0.6b")
    ap.add_argument("--bs", type=int, default=1)
    ap.add_argument("--every", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--attention", default="auto")
    ap.add_argument("--burn-ms", type=float, default=9.0, help="the 'python only' variant's host time per check")
    args = ap.parse_args()
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    extra = {} if args.device == "cuda" else dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                                                   num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                                   vocab_size=8192)
    ckpt = random_checkpoint(hf_config_for(args.shape, **extra), device=args.device, dtype=dtype)
    new_tokens = (args.rounds + 1) * args.steps + 8
    context = 128 + new_tokens + 16
    engines = {name: make_engine(ckpt, args.device, args.bs, context, 0 if name == "without" else args.every,
                                 args.attention) for name in ("without", "with", "no re-run", "python only",
                                                              "switch 50us")}
    split: dict[str, list[float]] = {"plan": [], "forward launch": [], "run": []}
    eager = engines["with"].parity._eager
    eager.attention.prepare = timed(split["plan"], eager.attention.prepare)
    eager.model = _TimedModel(eager.model, split["forward launch"])
    eager.run = timed(split["run"], eager.run)
    lazy = engines["no re-run"].parity
    lazy._eager.run = lambda batch: StepOutput(logits=lazy._logits_buf[: len(batch.sample_rows)].clone(), path="eager")
    burner = engines["python only"].parity

    def burn(batch: Any) -> StepOutput:  # the re-run's host time in pure Python (the GIL), no device work
        end = time.perf_counter() + args.burn_ms / 1e3
        while time.perf_counter() < end:
            sum(range(200))
        return StepOutput(logits=burner._logits_buf[: len(batch.sample_rows)].clone(), path="eager")

    burner._eager.run = burn
    handles = {name: fill_decode(eng, args.bs, new_tokens) for name, eng in engines.items()}
    subs = {name: eng.bus.subscribe("parity-cost", types={"step"}) for name, eng in engines.items()}
    step_ms: dict[str, list[tuple[float, bool]]] = {name: [] for name in engines}
    for warm in (True,) + (False,) * args.rounds:
        for name, eng in engines.items():
            checker = eng.parity
            interval = sys.getswitchinterval()
            if name == "switch 50us":
                sys.setswitchinterval(5e-5)
            sync(args.device)
            t_all = time.perf_counter()
            for _ in range(args.steps):
                busy = checker._running is not None and not checker._running.finished.is_set()
                t = time.perf_counter()
                eng.step()
                if not warm:
                    step_ms[name].append(((time.perf_counter() - t) * 1e3, busy))
            sync(args.device)
            sys.setswitchinterval(interval)
            paths = collections.Counter(f"{e.path}" + (f" ({e.fallback_reason})" if e.fallback_reason else "")
                                        for e in subs[name].drain() if getattr(e, "path", None))
            if not warm:
                print(f"  {name:>10}: steps {dict(paths)}", flush=True)
                print(f"  {name:>10}: {args.bs * args.steps / (time.perf_counter() - t_all):9.1f} tok/s", flush=True)
    base = statistics.median(v for v, _ in step_ms["without"])
    for name, rows in step_ms.items():
        inflight = [v for v, b in rows if b]
        idle = [v for v, b in rows if not b]
        print(f"{name:>10}: mean step {statistics.fmean(v for v, _ in rows):.3f} ms (median without {base:.3f});"
              f" {len(inflight)} steps with a check in flight, mean {statistics.fmean(inflight) if inflight else 0:.3f} ms;"
              f" others mean {statistics.fmean(idle):.3f} ms", flush=True)
    checker = engines["with"].parity
    checker.wait_idle()
    print(f"worker (with): checks {checker.checks}, skipped {checker.skipped}; per check median ms:"
          + "".join(f" {k} {statistics.median(v):.3f}" for k, v in split.items() if v), flush=True)
    for name, eng in engines.items():
        for h in handles[name]:
            eng.cancel(h.request_id)
        eng.run_until_idle()
        eng.close()
    return 0


class _TimedModel:
    """The model, with its forward call's host time recorded (the kernels it launches, not their run)."""

    def __init__(self, model: Any, store: list[float]) -> None:
        self._model, self._store = model, store

    def __call__(self, *a: Any, **k: Any) -> Any:
        return timed(self._store, self._model)(*a, **k)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


if __name__ == "__main__":
    sys.exit(main())
