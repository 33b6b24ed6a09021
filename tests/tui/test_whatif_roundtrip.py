"""The what-if predicts what a recapture then measures.

Record a workload on the emulated graphs, ask the dashboard's what-if for a candidate bucket list,
recapture with it, replay the same workload, and compare: the predicted hit rate and padding waste
must equal the measured ones, phase by phase. The lists are chosen so the prefill padding cap decides
steps both ways (the case the what-if once got wrong).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from graphtop.engine.graphs.config import build_graph_config
from graphtop.engine.graphs.fallback import FallbackReason
from graphtop.engine.sampling_params import SamplingParams
from graphtop.engine.telemetry import events as ev
from graphtop.engine.telemetry.bus import EventBus
from graphtop.engine.trace_tools.summary import summarize
from graphtop.tui.state import DashboardState
from graphtop.tui.whatif import what_if

pytestmark = pytest.mark.usefixtures("torch_one_thread")

# token-id prompts of chosen lengths (ids 10..), each with its own output length, arriving one after
# another: prefill steps of each size alone, between decode steps of 1 to 6 requests
PROMPT_LENS = [10, 14, 5, 40, 30, 7]
MAX_NEW = [3, 9, 5, 12, 7, 4]
INITIAL = {"decode.bs": [1, 2, 4, 8], "prefill.num_tokens": [16, 64], "prefill.max_padding_waste": 0.5}
CANDIDATE_DECODE = [2, 3]  # bs 1 pads to 2; bs 4-6 exceed the largest bucket
CANDIDATE_PREFILL = [24, 40, 64]


def _workload(engine, bus: EventBus) -> list[ev.Event]:
    sub = bus.subscribe("workload")
    prompts = [[10 + (i * 7 + j) % 50 for j in range(n)] for i, n in enumerate(PROMPT_LENS)]
    handles = []
    for p, m in zip(prompts, MAX_NEW):
        handles.append(engine.submit(p, SamplingParams(max_new_tokens=m, ignore_eos=True)))
        engine.step()  # its prefill
        engine.step()  # a decode step with everyone running
    engine.run_until_idle()
    assert all(h.finished and len(h.token_ids) == m for h, m in zip(handles, MAX_NEW))
    events = sub.drain()
    bus.unsubscribe(sub)
    return events


def test_predicted_hit_rate_and_padding_equal_the_measured(tiny_ckpt, make_engine):
    bus = EventBus()
    dashboard = bus.subscribe("dashboard")  # the dashboard sees everything from the start
    engine = make_engine(tiny_ckpt("llama"), bus=bus, graphs=build_graph_config(None, INITIAL))
    first = _workload(engine, bus)
    state = DashboardState()
    state.apply_all(dashboard.drain())
    assert state.prefill_padding_cap() == 0.5

    inputs = state.whatif_inputs()
    predicted = what_if(
        inputs.steps,
        CANDIDATE_DECODE,
        CANDIDATE_PREFILL,
        inputs.costs,
        max_padding_waste=inputs.max_padding_waste,
        current_decode=state.current_buckets("decode"),
        current_prefill=state.current_buckets("prefill"),
    )

    engine.recapture(decode_bs=CANDIDATE_DECODE, prefill_num_tokens=CANDIDATE_PREFILL)
    engine.run_until_idle()  # the recapture completes between polls
    assert (engine.decode_buckets, engine.prefill_buckets) == (CANDIDATE_DECODE, CANDIDATE_PREFILL)
    second = _workload(engine, bus)
    engine.close()

    before, measured = summarize(first), summarize(second)
    assert before.steps == measured.steps  # the same schedule, step for step
    for phase in ("decode", "prefill"):
        p, m = getattr(predicted, phase), measured.phases[phase]
        assert (p.steps, p.graph_steps, p.padded_tokens, p.bucket_tokens) == (
            m.steps,
            m.graph_steps,
            m.padded_tokens,
            m.bucket_tokens,
        ), phase
        assert p.hit_rate == m.hit_rate and p.padding_waste == m.padding_waste
    assert predicted.hit_rate == measured.hit_rate and predicted.padding_waste == measured.padding_waste

    # the cap decided steps both ways: fallbacks the candidate fixes, and graph hits it refuses
    cap = FallbackReason.PREFILL_PADDING_OVER_CAP.value

    def prefill_paths(events):
        return [
            (s.num_tokens, s.path, s.fallback_reason)
            for s in events
            if isinstance(s, ev.StepEvent) and s.phase == "prefill"
        ]

    pairs = list(zip(prefill_paths(first), prefill_paths(second)))
    assert any(a[2] == cap and b[1] == "graph" for a, b in pairs), pairs
    assert any(a[1] == "graph" and b[2] == cap for a, b in pairs), pairs
    assert 0 < predicted.hit_rate < 1


def test_current_lists_predict_what_ran(tiny_ckpt, make_engine):
    """The editor's "now" column: the what-if of the lists in use reproduces the run it saw."""
    bus = EventBus()
    dashboard = bus.subscribe("dashboard")
    engine = make_engine(tiny_ckpt("llama"), bus=bus, graphs=build_graph_config(None, INITIAL))
    events = _workload(engine, bus)
    engine.close()
    state = DashboardState()
    state.apply_all(dashboard.drain())
    inputs = state.whatif_inputs()
    now = what_if(
        inputs.steps,
        state.current_buckets("decode"),
        state.current_buckets("prefill"),
        max_padding_waste=inputs.max_padding_waste,
    )
    seen = summarize(events)
    assert (now.hit_rate, now.padding_waste) == (seen.hit_rate, seen.padding_waste)
    assert (state.hit_rate(), state.hits.padding_waste) == (seen.hit_rate, seen.padding_waste)
