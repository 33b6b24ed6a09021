"""bench/ab_decode.py sizes each engine's KV pool for the whole run: a pool too small for the batch's
contexts admits fewer rows or preempts them mid-measurement, while the floor is computed for every row."""

from __future__ import annotations

import subprocess
import sys
from argparse import Namespace
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import ab_decode  # noqa: E402
import graph_bench  # noqa: E402


def test_final_context_bounds_what_the_run_reaches(tiny_ckpt, make_engine):
    """The benchmark's own sequence (fill, 5 warm-up steps, rounds x steps) on a tiny CPU engine never
    grows a request's context past ``final_context``."""
    args = Namespace(rounds=2, steps=3)
    bs, prompt = 3, 20
    eng = make_engine(tiny_ckpt("llama"), graphs=False)
    handles = graph_bench.fill_decode(eng, bs, prompt_len=prompt)
    for _ in range(5 + args.rounds * args.steps):
        eng.step()
    longest = max(prompt + len(h._token_ids) for h in handles)
    final = ab_decode.final_context(prompt, args)
    assert final - 2 <= longest <= final  # a bound, and a close one (the engine may trail a step)
    for h in handles:
        eng.cancel(h.request_id)
    eng.run_until_idle()


def test_a_prompt_past_the_benchmark_context_is_refused_in_one_line():
    run = subprocess.run([sys.executable, str(BENCH / "ab_decode.py"), "--prompt", "128,1000", "--bs", "1"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "prompt 1000" in run.stderr and "Traceback" not in run.stderr
