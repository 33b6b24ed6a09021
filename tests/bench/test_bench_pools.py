"""bench/ab_decode.py and bench/graph_bench.py size each engine's KV pool for the whole run: a pool too
small for the batch's contexts admits fewer rows or preempts them mid-measurement, while the floor is
computed for every row."""

from __future__ import annotations

import subprocess
import sys
from argparse import Namespace

import ab_decode
import graph_bench
import harness
import pytest
from support.paths import BENCH


def test_final_context_bounds_what_the_run_reaches(tiny_ckpt, make_engine):
    """The benchmark's own sequence (fill, 5 warm-up steps, rounds x steps) on a tiny CPU engine never
    grows a request's context past ``final_context``."""
    args = Namespace(rounds=2, steps=3)
    bs, prompt = 3, 20
    eng = make_engine(tiny_ckpt("llama"), graphs=False)
    handles = harness.fill_decode(eng, bs, prompt_len=prompt)
    for _ in range(5 + args.rounds * args.steps):
        eng.step()
    longest = max(prompt + len(h._token_ids) for h in handles)
    final = ab_decode.final_context(prompt, args)
    assert final - 2 <= longest <= final  # a bound, and a close one (the engine may trail a step)
    harness.drain(eng, handles)


def test_decode_run_context_bounds_what_graph_bench_reaches(tiny_ckpt, make_engine, monkeypatch):
    """graph_bench's decode_ms (graph rounds on the emulated backend, eager rounds, the replay split) on a
    tiny CPU engine never grows a request's context past ``decode_run_context``."""
    import torch

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    longest: list[int] = []
    drain = graph_bench.drain

    def measure_then_drain(eng, handles):
        longest.append(max(harness.PROMPT_LEN + len(h._token_ids) for h in handles))
        drain(eng, handles)

    monkeypatch.setattr(graph_bench, "drain", measure_then_drain)
    steps, eager_steps, rounds = 3, 2, 2
    eng = make_engine(tiny_ckpt("llama"), max_context_len=256)  # the tiny model's positions
    out = graph_bench.decode_ms(eng, 3, steps, eager_steps, rounds)
    assert "graph" in out  # the graph rounds ran
    assert len(out["graph_rounds"]) == len(out["eager_rounds"]) == rounds
    final = graph_bench.decode_run_context(steps, eager_steps, rounds)
    assert final - 2 <= longest[0] <= final


@pytest.mark.parametrize(
    "script,argv,says",
    [
        ("ab_decode.py", ["--prompt", "128,1000", "--bs", "1"], "prompt 1000"),
        ("graph_bench.py", ["--rounds", "20"], "20 rounds"),
    ],
)
def test_a_run_past_the_benchmark_context_is_refused_in_one_line(script, argv, says):
    run = subprocess.run([sys.executable, str(BENCH / script), *argv], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert says in run.stderr and "Traceback" not in run.stderr
