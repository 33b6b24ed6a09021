"""The bucket advisor on a recorded synthetic trace: its advice, captured, does what it predicted.

Record a seeded synthetic workload on the emulated graphs to a JSONL trace, run ``graphtop advise``
on the file, recapture with the ``--cuda-graph-config`` it prints, replay the same workload, and
compare: the predicted hit rate and padding equal the measured ones, phase by phase. At the same
graph count the advice costs less than SGLang's default decode list on that trace.
"""

from __future__ import annotations

import json
import os
import shlex

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from graphtop.cli.entry import main
from graphtop.cli.workload import SyntheticWorkload
from graphtop.engine.graphs.bucket_advisor import expected_cost
from graphtop.engine.graphs.bucket_demand import phase_demand
from graphtop.engine.graphs.config import build_graph_config, default_decode_buckets
from graphtop.engine.sampling_params import SamplingParams
from graphtop.engine.telemetry.bus import EventBus
from graphtop.engine.telemetry.events import StepEvent
from graphtop.engine.telemetry.recorder import TraceRecorder
from graphtop.engine.trace_tools.summary import summarize
from graphtop.engine.trace_tools.trace import read_trace
from graphtop.tui.state import DashboardState
from graphtop.tui.whatif import what_if

pytestmark = pytest.mark.usefixtures("torch_one_thread")

# SGLang's first four decode buckets, and a prefill list whose 50 % cap refuses some sizes
INITIAL = {"decode.bs": [1, 2, 4, 8], "prefill.num_tokens": [16, 64], "prefill.max_padding_waste": 0.5}


def _workload(engine, vocab: int):
    """Seeded synthetic requests, one arriving every other step: prefills of many sizes between
    decode steps of 1 to 8 requests. Fixed output lengths (ignore_eos) make the schedule the same on
    every run, whatever the graphs compute."""
    synth = SyntheticWorkload(
        14, seed=7, prompt_len="uniform:3:60", output_len="uniform:2:18", vocab_size=vocab, low=10
    )
    handles = []
    for r in synth:
        handles.append(
            engine.submit(
                r.prompt_token_ids, SamplingParams(max_new_tokens=r.max_new_tokens, ignore_eos=True, detokenize=False)
            )
        )
        engine.step()
        engine.step()
    engine.run_until_idle()
    assert all(h.finished for h in handles)


def _steps(events) -> list[StepEvent]:
    return [e for e in events if isinstance(e, StepEvent)]


def test_advice_recaptured_gives_the_predicted_hit_rate_and_padding(tiny_ckpt, make_engine, tmp_path, capsys):
    bus = EventBus()
    path = tmp_path / "synthetic.jsonl"
    recorder = TraceRecorder(path, bus, header_meta={"workload": "synthetic"})  # from engine start on
    engine = make_engine(tiny_ckpt("llama"), bus=bus, graphs=build_graph_config(None, INITIAL))
    _workload(engine, engine.spec.vocab_size)
    recorder.close()

    assert main(["advise", str(path)]) == 0
    out = capsys.readouterr().out
    config = json.loads(shlex.split(out.strip().splitlines()[-1])[1])  # the ready --cuda-graph-config
    advised_decode, advised_prefill = config["decode"]["bs"], config["prefill"]["num_tokens"]
    assert config["prefill"]["max_padding_waste"] == 0.5
    assert len(advised_decode) <= 4 and len(advised_prefill) <= 2  # the trace's graph counts

    trace = read_trace(path)
    state = DashboardState(step_history=None)
    state.apply_all(trace.events)
    inputs = state.whatif_inputs()
    predicted = what_if(
        inputs.steps,
        advised_decode,
        advised_prefill,
        inputs.costs,
        max_padding_waste=0.5,
        current_decode=INITIAL["decode.bs"],
        current_prefill=INITIAL["prefill.num_tokens"],
    )
    for phase in ("decode", "prefill"):  # what the CLI printed is that prediction
        p = getattr(predicted, phase)
        block = out.split(f"\n{phase} ", 1)[1]
        assert f"{100 * p.hit_rate:.1f}%" in block.splitlines()[3]
        assert f"{100 * p.padding_waste:.1f}%" in block.splitlines()[4]

    sub = bus.subscribe("replay")
    engine.recapture(decode_bs=advised_decode, prefill_num_tokens=advised_prefill)
    engine.run_until_idle()
    assert (engine.decode_buckets, engine.prefill_buckets) == (advised_decode, advised_prefill)
    _workload(engine, engine.spec.vocab_size)
    engine.close()
    measured = summarize(_steps(sub.drain()))
    recorded = summarize(_steps(trace.events))
    assert measured.steps == recorded.steps  # the same schedule, step for step
    for phase in ("decode", "prefill"):
        p, m = getattr(predicted, phase), measured.phases[phase]
        assert (p.steps, p.graph_steps, p.padded_tokens, p.bucket_tokens) == (
            m.steps,
            m.graph_steps,
            m.padded_tokens,
            m.bucket_tokens,
        ), phase
        assert p.hit_rate == m.hit_rate and p.padding_waste == m.padding_waste
    # the advice costs less than the lists that ran, under the advisor's cost model (it minimises
    # cost, which may trade a few prefill hits for much less padding)
    ran = {"decode": INITIAL["decode.bs"], "prefill": INITIAL["prefill.num_tokens"]}
    new = {"decode": advised_decode, "prefill": advised_prefill}
    for phase, cap in (("decode", None), ("prefill", 0.5)):
        d = phase_demand(inputs.steps, phase, ran[phase], cap)
        before, after = (
            expected_cost(phase, d.sizes, lst, eager_ratio=d.ratio.value, max_padding_waste=cap)
            for lst in (ran[phase], new[phase])
        )
        assert after < before, (phase, before, after)

    # better than SGLang's default decode list at the same graph count
    demand = phase_demand(inputs.steps, "decode", INITIAL["decode.bs"])
    sglang = default_decode_buckets(256)[: len(advised_decode)]
    cost = {
        name: expected_cost("decode", demand.sizes, lst, eager_ratio=demand.ratio.value)
        for name, lst in (("advice", advised_decode), ("sglang", sglang))
    }
    assert cost["advice"] < cost["sglang"], (advised_decode, sglang, cost)
    sg = what_if(
        inputs.steps,
        sglang,
        advised_prefill,
        max_padding_waste=0.5,
        current_decode=INITIAL["decode.bs"],
        current_prefill=INITIAL["prefill.num_tokens"],
    )
    assert predicted.decode.hit_rate >= sg.decode.hit_rate
