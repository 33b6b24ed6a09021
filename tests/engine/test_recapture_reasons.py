"""Steps during a recapture carry one reason: a step the new lists cover but whose graph is not there
yet runs eagerly as ``recapture_in_progress``, never as ``exceeds_max_bucket`` (which would tell the
reader to add a bucket the recapture is about to provide). The dashboard's fallback list, what-if and
advisor all read these reasons."""

from __future__ import annotations

import pytest

import graphtop.engine.graphs.model_runner as model_runner_mod
from graphtop.engine.sampling_params import SamplingParams
from graphtop.engine.telemetry import events as ev
from graphtop.engine.telemetry.bus import EventBus

pytestmark = pytest.mark.usefixtures("torch_one_thread")

PROMPTS = [
    "Once upon a time",
    "The quick brown fox jumps over",
    "Graphs are a fast path",
    "hello",
    "a b c d e f g h i j k",
    "what is the meaning of life",
]


def size_of(step: ev.StepEvent) -> int:
    return step.batch_size if step.phase == "decode" else step.num_tokens


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "plain"])
def test_steps_during_a_recapture_are_labelled_recapture_in_progress(tiny_ckpt, make_engine, monkeypatch, overlap):
    monkeypatch.setattr(model_runner_mod, "RECAPTURE_SLICE_S", 0.0)  # one bucket per step boundary: many steps
    bus = EventBus()
    sub = bus.subscribe("t")
    engine = make_engine(tiny_ckpt("llama"), bus=bus, chunked_prefill_size=16, overlap_schedule=overlap)
    decode, prefill = list(engine.decode_buckets), list(engine.prefill_buckets)
    handles = [engine.submit(p, SamplingParams(max_new_tokens=40, ignore_eos=True)) for p in PROMPTS[:4]]
    for _ in range(6):
        engine.step()
    sub.drain()
    engine.recapture(decode_bs=decode, prefill_num_tokens=prefill)  # the same lists: every size stays covered
    engine.step()
    handles += [engine.submit(p, SamplingParams(max_new_tokens=20, ignore_eos=True)) for p in PROMPTS[4:]]
    engine.run_until_idle()
    assert all(h.finished for h in handles)
    events = sub.drain()
    open_phases: set[str] = set()
    during: list[ev.StepEvent] = []
    for e in events:
        if isinstance(e, ev.CaptureStarted) and e.reason == "recapture":
            open_phases.add(e.phase)
        elif isinstance(e, ev.CaptureFinished):
            open_phases.discard(e.phase)
        elif isinstance(e, ev.StepEvent) and e.phase in open_phases:
            during.append(e)
    eager = [s for s in during if s.path == "eager"]
    assert eager, "no step ran while its phase was being recaptured"
    limits = {"decode": max(decode), "prefill": max(prefill)}
    for s in eager:
        assert size_of(s) <= limits[s.phase]  # the new lists cover every one of them ...
        assert s.fallback_reason == "recapture_in_progress", s  # ... so the recapture is the one reason
    (finished,) = [e for e in events if isinstance(e, ev.RecaptureFinished)]
    assert finished.ok
    after = [s for s in events if isinstance(s, ev.StepEvent) and s.ts > finished.ts]
    assert after and all(s.path == "graph" for s in after)
