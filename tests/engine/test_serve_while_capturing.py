"""Serving from the first step: requests run while the first graph capture proceeds between steps.

The engine starts capturing and serves at once; each bucket goes live the moment it is captured,
and a step whose bucket is not captured yet runs eagerly with ``not_yet_captured``. Tokens equal
those of an engine that captured everything first (``capture_before_serving``).
"""

from __future__ import annotations

import json

import pytest

import graphtop.engine.graphs.model_runner as model_runner_mod
from graphtop.engine.graphs.bucket_policy import BucketPolicy
from graphtop.engine.graphs.config import build_graph_config
from graphtop.engine.graphs.fallback import FallbackReason
from graphtop.engine.graphs.runners.bucketed import BucketedGraphRunner
from graphtop.engine.sampling_params import SamplingParams
from graphtop.engine.telemetry import events as ev
from graphtop.engine.telemetry.bus import EventBus

pytestmark = pytest.mark.usefixtures("torch_one_thread")

PROMPTS = [
    "In a hole in the ground there lived a hobbit, not a nasty one",
    "Once upon a time",
    "The quick brown fox jumps over",
    "hello",
    "what is the meaning of life and everything else",
    "a b c d e f g h i j k",
]
MAX_NEW = [12, 20, 9, 16, 11, 14]


@pytest.fixture(scope="module")
def llama(tiny_ckpt):
    return tiny_ckpt("llama")


def run(make_engine, path, *, capture_before_serving: bool, **cfg):
    """Submit every prompt right after construction; serve them to the end. -> engine, tokens, events."""
    bus = EventBus()
    sub = bus.subscribe("test")
    engine = make_engine(path, bus=bus, capture_before_serving=capture_before_serving, **cfg)
    handles = [engine.submit(p, SamplingParams(max_new_tokens=m, ignore_eos=True)) for p, m in zip(PROMPTS, MAX_NEW)]
    engine.run_until_done(handles)
    events = sub.drain()
    for e in events:
        assert ev.validate_event_dict(json.loads(json.dumps(e.to_dict()))) is type(e)
    return engine, [h.token_ids for h in handles], events


def test_requests_before_capture_ends_match_capture_before_serving(llama, make_engine, monkeypatch):
    """One stage per step boundary: the capture spans many steps of these requests."""
    monkeypatch.setattr(model_runner_mod, "RECAPTURE_SLICE_S", 0.0)
    _, want, strict_events = run(make_engine, llama, capture_before_serving=True)
    engine, got, events = run(make_engine, llama, capture_before_serving=False)
    assert got == want
    assert {s.fallback_reason for s in strict_events if isinstance(s, ev.StepEvent)} == {None}

    # every step before its bucket is captured is eager with the named reason, every one after replays it
    final = {r.phase: r.policy for r in (engine.model_runner.decode, engine.model_runner.prefill)}
    assert all(not p.pending for p in final.values())  # the capture finished meanwhile ...
    assert final["decode"].buckets == (1, 2, 4, 8) and final["prefill"].buckets[-1] == 64
    live: set[tuple[str, int]] = set()
    seen = {"not_yet_captured": 0, "graph while capturing": 0}
    capturing = True
    for e in events:
        if isinstance(e, ev.CaptureProgress):
            assert e.ok
            live.add((e.phase, e.bucket))
        elif isinstance(e, ev.CaptureFinished) and e.phase == "prefill":
            capturing = False  # prefill has the longer list: it finishes last
        elif isinstance(e, ev.StepEvent):
            size = e.batch_size if e.phase == "decode" else e.num_tokens
            policy = final["decode" if e.phase == "decode" else "prefill"]
            decision = policy.decide(size)
            assert decision.graph, (e.phase, size)  # this workload fits the lists and the padding cap
            phase = "decode" if e.phase == "decode" else "prefill"
            if (phase, decision.bucket) in live:
                assert (e.path, e.bucket, e.padded) == ("graph", decision.bucket, decision.padded), e
                seen["graph while capturing"] += capturing
            else:
                assert (e.path, e.fallback_reason, e.bucket) == ("eager", "not_yet_captured", None), e
                seen["not_yet_captured"] += 1
    assert seen["not_yet_captured"] and seen["graph while capturing"], seen  # buckets went live one by one
    assert not capturing  # ... before the requests ended


def test_capture_order_puts_small_emulated_buckets_first(llama, make_engine):
    bus = EventBus()
    sub = bus.subscribe("t", types={"capture_started"})
    make_engine(llama, bus=bus, capture_before_serving=False)
    started = {e.phase: e.buckets for e in sub.drain()}
    assert started["decode"] == (1, 2, 4, 8)  # no shared pool on a CPU: what a first request needs comes first
    assert list(started["prefill"]) == sorted(started["prefill"])


def test_steps_wait_for_their_own_bucket_not_a_larger_one():
    """A larger bucket captured first is not borrowed: the step waits for the bucket it will keep."""
    policy = BucketPolicy.of("decode", [8], [1, 2, 4, 8], pending=[1, 2, 4])
    assert policy.decide(3).reason is FallbackReason.NOT_YET_CAPTURED
    assert (policy.decide(6).bucket, policy.decide(6).padded) == (8, 2)
    assert policy.decide(9).reason is FallbackReason.EXCEEDS_MAX_BUCKET
    recapture = BucketPolicy.of("decode", [1], [1, 2], pending=[2], pending_reason=FallbackReason.RECAPTURE_IN_PROGRESS)
    assert recapture.decide(2).reason is FallbackReason.RECAPTURE_IN_PROGRESS
    capped = BucketPolicy.of("prefill", [], [16, 64], 0.25, pending=[16, 64])
    assert capped.decide(17).reason is FallbackReason.PREFILL_PADDING_OVER_CAP  # eager either way: say why
    assert capped.decide(60).reason is FallbackReason.NOT_YET_CAPTURED


def test_idle_engine_captures_and_wait_for_capture_drives_it(llama, make_engine):
    engine = make_engine(llama, capture_before_serving=False)
    assert engine.capture_pending and engine.decode_buckets == []
    assert engine.wait_for_capture(timeout=120)
    assert not engine.capture_pending
    assert engine.decode_buckets == [1, 2, 4, 8] and engine.prefill_buckets[-1] == 64
    assert engine.wait_for_capture(timeout=0)  # nothing pending: at once


def test_waits_take_inf_as_no_timeout_and_refuse_nan(llama, make_engine):
    """The timeout policy of engine/arguments.py: inf waits forever (threading raised OverflowError), NaN
    is a one-line ValueError (RequestHandle.wait spun on it)."""
    engine = make_engine(llama, capture_before_serving=False)
    engine.start_background()
    try:
        handle = engine.submit(PROMPTS[0], SamplingParams(max_new_tokens=4, ignore_eos=True))
        assert engine.wait_for_capture(timeout=float("inf"))
        assert handle.wait(float("inf")) and len(handle.token_ids) == 4
        for wait, name in ((engine.wait_for_capture, "wait_for_capture"), (handle.wait, "RequestHandle.wait")):
            with pytest.raises(ValueError, match=f"{name}: timeout must be a number of seconds or None, got nan"):
                wait(float("nan"))
    finally:
        engine.shutdown()
    assert engine.last_error is None


def test_wait_for_capture_in_background_mode_covers_a_recapture(llama, make_engine):
    engine = make_engine(llama, capture_before_serving=False)
    engine.start_background()
    try:
        handle = engine.submit(PROMPTS[0], SamplingParams(max_new_tokens=8, ignore_eos=True))
        assert engine.wait_for_capture(timeout=120)
        assert engine.decode_buckets == [1, 2, 4, 8]
        engine.recapture(decode_bs=[1, 3])
        assert engine.wait_for_capture(timeout=120)  # asked after the recapture: waits for it too
        assert engine.decode_buckets == [1, 3]
        assert handle.wait(120) and len(handle.token_ids) == 8
    finally:
        engine.shutdown()
    assert engine.last_error is None


def test_capture_runs_only_with_nothing_in_flight(llama, make_engine, monkeypatch):
    """Under the overlap schedule a launched step is read back before a capture slice runs (on CUDA a
    capture must never race a step still using the static buffers)."""
    monkeypatch.setattr(model_runner_mod, "RECAPTURE_SLICE_S", 0.0)
    real = BucketedGraphRunner._capture_stages
    in_flight_at_capture: list[bool] = []
    engines = []

    def capture(self, size):
        in_flight_at_capture.append(engines[0].loop.pending is not None)
        return real(self, size)

    monkeypatch.setattr(BucketedGraphRunner, "_capture_stages", capture)
    engine = make_engine(llama, capture_before_serving=False)
    engines.append(engine)
    handles = [engine.submit(p, SamplingParams(max_new_tokens=30, ignore_eos=True)) for p in PROMPTS[:2]]
    engine.run_until_done(handles)
    assert in_flight_at_capture and not any(in_flight_at_capture)
    engine.run_until_done([engine.submit(PROMPTS[3], SamplingParams(max_new_tokens=30, ignore_eos=True))])
    assert not engine.capture_pending and engine.overlapped_steps > 0  # the overlap schedule is back after


def test_a_failed_bucket_still_falls_back_as_capture_failed(llama, make_engine, monkeypatch):
    real = BucketedGraphRunner._capture_stages

    def flaky(self, size):
        if self.phase == "decode" and size == 4:
            raise RuntimeError("boom")
        return real(self, size)

    monkeypatch.setattr(BucketedGraphRunner, "_capture_stages", flaky)
    graphs = build_graph_config(None, {"decode.bs": [1, 2, 4]})
    engine, _, events = run(make_engine, llama, capture_before_serving=False, graphs=graphs)
    assert engine.decode_buckets == [1, 2]
    decode = [e for e in events if isinstance(e, ev.StepEvent) and e.phase == "decode" and e.batch_size in (3, 4)]
    assert decode and decode[-1].fallback_reason == "capture_failed"
