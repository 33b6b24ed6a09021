"""Graph runners on CPU through the emulated backend: the same buckets, padding, fallbacks and
recapture as on CUDA, with static-buffer addresses checked on every replay."""

from __future__ import annotations

import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from support.tiny_models import shared_tokenizer

import graphtop.engine.graphs.model_runner as model_runner_mod
from graphtop.engine.attention import torch_native
from graphtop.engine.graphs.bucket_policy import BucketDecision
from graphtop.engine.graphs.buffers import StaticBufferError
from graphtop.engine.graphs.config import GraphConfig, build_graph_config
from graphtop.engine.graphs.fallback import FallbackReason
from graphtop.engine.graphs.runners.decode_graph import DecodeGraphRunner
from graphtop.engine.kv_pool import DUMMY_PAGE
from graphtop.engine.sampling_params import SamplingParams
from graphtop.engine.telemetry import events as ev
from graphtop.engine.telemetry.bus import EventBus

pytestmark = pytest.mark.usefixtures("torch_one_thread")

PROMPTS = [
    "Once upon a time",  # 11 tokens
    "The quick brown fox jumps over",  # 16
    "In a hole in the ground there lived a hobbit, not a nasty one",  # 32
    "Graphs are a fast path",  # 13
    "hello",  # 3
    "a b c d e f g h i j k",  # 13
    "zzz",  # 3
    "what is the meaning of life and everything else",  # 18
]


def n_tokens(prompt) -> int:
    return len(shared_tokenizer().encode(prompt)) if isinstance(prompt, str) else len(prompt)


def locked(flags: dict) -> GraphConfig:
    """A graph config as the CLI builds it: every given key is locked."""
    return build_graph_config(None, flags)


@pytest.fixture(scope="module")
def llama(tiny_ckpt):
    return tiny_ckpt("llama")


def serve(make_engine, path, prompts, max_new, graphs=None, schedule=None, **cfg):
    """Run `prompts` (submitted at once, or per `schedule`: {step_no: [prompt indices]}) and return
    (engine, token ids per prompt, every event)."""
    bus = EventBus()
    sub = bus.subscribe("test")
    engine = make_engine(path, bus=bus, graphs=graphs, **cfg)
    if isinstance(max_new, int):
        max_new = [max_new] * len(prompts)
    handles = {}
    schedule = schedule or {0: list(range(len(prompts)))}
    step = 0
    while True:
        for i in schedule.get(step, []):
            handles[i] = engine.submit(prompts[i], SamplingParams(max_new_tokens=max_new[i], ignore_eos=True))
        worked = engine.step()
        step += 1
        if not worked and step > max(schedule):
            break
    assert engine.pool.used_pages == 0
    events = sub.drain()
    for e in events:  # capture failures, downgrades, fallbacks: all still valid trace events
        assert ev.validate_event_dict(json.loads(json.dumps(e.to_dict()))) is type(e)
    return engine, [handles[i].token_ids for i in range(len(prompts))], events


def steps_of(events, phase=None):
    return [e for e in events if isinstance(e, ev.StepEvent) and (phase is None or e.phase == phase)]


def reasons(events, phase=None):
    return {e.fallback_reason for e in steps_of(events, phase)}


# --- bucket choice ------------------------------------------------------------------------------


def test_bucket_choice_is_smallest_captured_at_least_size(llama, make_engine):
    graphs = locked({"decode.bs": [1, 3, 8], "prefill.num_tokens": [8, 24, 64], "prefill.max_padding_waste": 1.0})
    schedule = {0: [0, 4], 2: [1, 2, 6], 5: [3], 7: [5, 7]}
    engine, _, events = serve(
        make_engine, llama, PROMPTS, [30, 9, 12, 20, 5, 25, 7, 14], graphs=graphs, schedule=schedule
    )
    assert engine.decode_buckets == [1, 3, 8] and engine.prefill_buckets == [8, 24, 64]
    for runner, buckets in ((engine.model_runner.decode, [1, 3, 8]), (engine.model_runner.prefill, [8, 24, 64])):
        for n in range(0, 70):
            assert runner.policy.pick(n) == next((b for b in buckets if b >= n), None)
    used = set()
    for s in steps_of(events):
        size = s.batch_size if s.phase == "decode" else s.num_tokens
        buckets = engine.decode_buckets if s.phase == "decode" else engine.prefill_buckets
        assert s.path == "graph" and s.fallback_reason is None and s.emulated
        assert s.bucket == min(b for b in buckets if b >= size)
        assert s.padded == s.bucket - size and s.padding_waste == pytest.approx(s.padded / s.bucket)
        used.add((s.phase, s.bucket))
    assert {b for p, b in used if p == "decode"} == {1, 3, 8}  # the workload hit every decode bucket
    assert any(s.padded for s in steps_of(events, "decode")) and any(s.padded for s in steps_of(events, "prefill"))


def test_a_step_replays_the_bucket_decided_for_it(llama, make_engine, monkeypatch):
    """A step's bucket is decided once and the graph runner replays that decision without picking again:
    a decode runner whose decision is bucket 8 for every batch replays 8 (padded to it, not the smallest
    bucket that fits), one decision a step, and serves the tokens eager serves."""
    _, eager_tokens, _ = serve(make_engine, llama, PROMPTS[:3], 6, graphs=False)
    shipped = DecodeGraphRunner.decide
    decided: list[int] = []

    def widest(self: DecodeGraphRunner, batch) -> BucketDecision:
        decided.append(batch.batch_size)
        decision = shipped(self, batch)
        return BucketDecision(8, 8 - batch.batch_size) if decision.graph else decision

    monkeypatch.setattr(DecodeGraphRunner, "decide", widest)
    _, tokens, events = serve(make_engine, llama, PROMPTS[:3], 6, graphs=locked({"decode.bs": [1, 2, 4, 8]}))
    decode = steps_of(events, "decode")
    assert decode and all(s.path == "graph" and s.bucket == 8 and s.padded == 8 - s.batch_size for s in decode)
    assert decided == [s.batch_size for s in decode]
    assert tokens == eager_tokens


def test_engine_reports_emulation_everywhere(llama, make_engine):
    engine, _, events = serve(make_engine, llama, PROMPTS[:2], 4)
    assert engine.info.emulated and engine.model_runner.emulated
    assert (engine.info.decode_graph_backend, engine.info.prefill_graph_backend) == (
        "emulated-full",
        "emulated-breakable",
    )
    started = [e for e in events if isinstance(e, ev.CaptureStarted)]
    assert {(e.phase, e.backend) for e in started} == {("decode", "emulated-full"), ("prefill", "emulated-breakable")}
    assert all(s.emulated == (s.path == "graph") for s in steps_of(events))
    assert any(s.segment_ms is not None and s.break_ms is not None for s in steps_of(events, "prefill"))


# --- resolved lists and downgrades through the engine --------------------------------------------


def test_engine_bucket_lists_follow_pool_and_request_limits(llama, make_engine):
    engine = make_engine(llama, max_total_tokens=100, max_running_requests=10, chunked_prefill_size=2048)
    assert engine.kv_capacity_tokens == 100
    assert engine.decode_buckets == [1, 2, 4, 8, 10]  # max running appended
    assert engine.prefill_buckets[-3:] == [80, 96, 100]  # the pool size appended
    assert engine.prefill_buckets[:8] == [4, 8, 12, 16, 20, 24, 28, 32]


def test_downgrades_published_and_locked_keys_kept(llama, make_engine):
    bus = EventBus()
    sub = bus.subscribe("t", types=["config_downgrade", "engine_started"])
    engine = make_engine(llama, bus=bus, graphs=GraphConfig(decode_max_bs=64, prefill_num_tokens=[8, 256]))
    events = sub.drain()
    for e in events:
        ev.validate_event_dict(json.loads(json.dumps(e.to_dict())))
    downgrades = {e.key: e for e in events if isinstance(e, ev.ConfigDowngrade)}
    assert set(downgrades) == {"decode.max_bs", "prefill.num_tokens"}
    assert (downgrades["decode.max_bs"].old, downgrades["decode.max_bs"].new) == (64, 8)
    assert (downgrades["prefill.num_tokens"].old, downgrades["prefill.num_tokens"].new) == ([8, 256], [8, 64])
    assert all(d.reason for d in downgrades.values())
    assert engine.decode_buckets == [1, 2, 4, 8] and engine.prefill_buckets == [8, 64]

    bus = EventBus()
    sub = bus.subscribe("t", types=["config_downgrade", "engine_started"])
    engine = make_engine(
        llama, bus=bus, graphs=locked({"decode.max_bs": 64, "decode.bs": [1, 2, 16], "prefill.num_tokens": [8, 256]})
    )
    events = sub.drain()
    assert not [e for e in events if isinstance(e, ev.ConfigDowngrade)]
    assert events[0].locked_keys == ("decode.bs", "decode.max_bs", "prefill.num_tokens")
    assert engine.decode_buckets == [1, 2, 16] and engine.prefill_buckets == [8, 256]


# --- padding never touches real KV ----------------------------------------------------------------


def _kv_by_slot(pool) -> torch.Tensor:
    """[slots, everything else] copy of the whole pool: K and V of every layer."""
    parts = [c.reshape(pool.num_pages * pool.page_size, -1) for c in pool.k_cache + pool.v_cache]
    return torch.cat(parts, dim=1).clone()


def _changed_slots(before: torch.Tensor, after: torch.Tensor) -> set[int]:
    return set(torch.nonzero((before != after).any(dim=1)).flatten().tolist())


@pytest.mark.parametrize("decode_bs,page_size", [([4], 1), ([4], 16), ([3], 1)], ids=["pad-ps1", "pad-ps16", "nopad"])
def test_padded_decode_rows_never_touch_a_real_kv_slot(llama, make_engine, decode_bs, page_size):
    bus = EventBus()
    sub = bus.subscribe("t", types=["step"])
    engine = make_engine(
        llama, bus=bus, graphs=locked({"decode.bs": decode_bs}), page_size=page_size, max_total_tokens=512
    )
    for p in PROMPTS[:3]:
        engine.submit(p, SamplingParams(max_new_tokens=10, ignore_eos=True))
    engine.step()  # one prefill of all three
    engine.step()  # one decode: steady state
    reqs = list(engine.scheduler.running)
    assert len(reqs) == 3 and not any(r.in_prefill for r in reqs)
    pool = engine.pool
    dummy = set(range(DUMMY_PAGE * page_size, (DUMMY_PAGE + 1) * page_size))
    for cache in pool.k_cache + pool.v_cache:
        cache[DUMMY_PAGE].zero_()  # capture and earlier padding wrote here; start clean
    positions = [r.num_computed for r in reqs]
    owned_before = {s for r in reqs for s in pool.slots(r.pages, 0, r.num_computed)}
    before = _kv_by_slot(pool)
    sub.drain()
    engine.step()
    (step,) = sub.drain()
    assert (step.phase, step.path, step.batch_size, step.bucket) == ("decode", "graph", 3, decode_bs[0])
    new = {pool.slots(r.pages, p, p + 1)[0] for r, p in zip(reqs, positions)}
    assert not new & (owned_before | dummy)
    changed = _changed_slots(before, _kv_by_slot(pool))
    assert new <= changed  # the real rows wrote their K/V
    if step.padded:
        assert step.padded == 1
        assert changed - new and changed - new <= dummy  # the padded row wrote the dummy page, and only it
    else:
        assert changed == new  # nothing else was written at all


def test_padded_prefill_tokens_never_touch_kv(llama, make_engine):
    bus = EventBus()
    sub = bus.subscribe("t", types=["step"])
    engine = make_engine(llama, bus=bus, graphs=locked({"prefill.num_tokens": [16], "prefill.max_padding_waste": 1.0}))
    engine.generate([PROMPTS[4]], SamplingParams(max_new_tokens=3, ignore_eos=True))  # pages get reused below
    for cache in engine.pool.k_cache + engine.pool.v_cache:
        cache[DUMMY_PAGE].zero_()
    handle = engine.submit(PROMPTS[0], SamplingParams(max_new_tokens=2, ignore_eos=True))
    before = _kv_by_slot(engine.pool)
    sub.drain()
    engine.step()
    (step,) = sub.drain()
    n = len(handle.prompt_ids)
    assert (step.phase, step.path, step.num_tokens, step.bucket, step.padded) == ("prefill", "graph", n, 16, 16 - n)
    (req,) = engine.scheduler.running
    assert _changed_slots(before, _kv_by_slot(engine.pool)) == set(engine.pool.slots(req.pages, 0, n))


# --- named fallbacks ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def eager_reference(llama, make_engine):
    cache = {}

    def get(prompts, max_new):
        key = (tuple(prompts), tuple(max_new) if isinstance(max_new, list) else max_new)
        if key not in cache:
            cache[key] = serve(make_engine, llama, prompts, max_new, graphs=False)[1]
        return cache[key]

    return get


def test_phase_disabled(llama, make_engine):
    _, _, events = serve(make_engine, llama, PROMPTS[:3], 4, graphs=False)
    assert all(s.path == "eager" and s.bucket is None for s in steps_of(events))
    assert reasons(events) == {"phase_disabled"}
    _, _, events = serve(make_engine, llama, PROMPTS[:3], 4, graphs=locked({"decode.backend": "disabled"}))
    assert reasons(events, "decode") == {"phase_disabled"} and reasons(events, "prefill") == {None}


def test_exceeds_max_bucket(llama, make_engine, eager_reference):
    prompts, max_new = PROMPTS[:3], [4, 8, 12]
    _, tokens, events = serve(make_engine, llama, prompts, max_new, graphs=locked({"decode.bs": [1, 2]}))
    for s in steps_of(events, "decode"):
        if s.batch_size > 2:
            assert (s.path, s.fallback_reason, s.bucket) == ("eager", "exceeds_max_bucket", None)
        else:
            assert (s.path, s.fallback_reason) == ("graph", None)
    assert {s.batch_size for s in steps_of(events, "decode")} == {1, 2, 3}
    assert tokens == eager_reference(prompts, max_new)


def test_prefill_tokens_over_max_bucket(llama, make_engine):
    _, _, events = serve(make_engine, llama, [PROMPTS[3]], 2, graphs=locked({"prefill.num_tokens": [4, 8]}))
    (prefill,) = steps_of(events, "prefill")
    assert (prefill.num_tokens, prefill.path, prefill.fallback_reason) == (
        13,
        "eager",
        "prefill_tokens_over_max_bucket",
    )
    _, _, events = serve(make_engine, llama, [PROMPTS[4]], 2, graphs=locked({"prefill.num_tokens": [4, 8]}))
    assert [(s.path, s.bucket) for s in steps_of(events, "prefill")] == [("graph", 4)]


def test_prefill_padding_over_cap(llama, make_engine):
    graphs = locked({"prefill.num_tokens": [4, 64]})
    _, _, events = serve(make_engine, llama, [PROMPTS[3]], 2, graphs=graphs)
    (prefill,) = steps_of(events, "prefill")
    assert (prefill.path, prefill.fallback_reason) == ("eager", "prefill_padding_over_cap")  # 51/64 > 25 %
    graphs = locked({"prefill.num_tokens": [4, 64], "prefill.max_padding_waste": 0.9})
    _, _, events = serve(make_engine, llama, [PROMPTS[3]], 2, graphs=graphs)
    assert [(s.path, s.bucket, s.padded) for s in steps_of(events, "prefill")] == [("graph", 64, 51)]


def test_context_exceeds_graph(llama, make_engine, eager_reference, monkeypatch):
    monkeypatch.setattr(torch_native, "GRAPH_MAX_CONTEXT", 8)
    prompts = [PROMPTS[4], PROMPTS[6]]  # 3 tokens each
    _, tokens, events = serve(make_engine, llama, prompts, 12)
    decode = steps_of(events, "decode")
    short = [s for s in decode if s.fallback_reason is None]
    long_ = [s for s in decode if s.fallback_reason == "context_exceeds_graph"]
    assert short and long_ and len(short) + len(long_) == len(decode)
    assert max(x.step for x in short) < min(x.step for x in long_)  # graph until the context outgrows it
    assert len(short) == 8 - 3  # contexts 4..8 fit the 8-slot page table (ps 1)
    assert tokens == eager_reference(prompts, 12)


def test_capture_failed(llama, make_engine, eager_reference, monkeypatch):
    real = DecodeGraphRunner._capture_stages

    def flaky(self, bs):
        if bs == 4:
            raise RuntimeError("boom\nsecond line")
        return real(self, bs)

    monkeypatch.setattr(DecodeGraphRunner, "_capture_stages", flaky)
    prompts, max_new = PROMPTS[:3], [4, 8, 12]
    engine, tokens, events = serve(make_engine, llama, prompts, max_new, graphs=locked({"decode.bs": [1, 2, 4]}))
    assert engine.decode_buckets == [1, 2]
    progress = {e.bucket: e for e in events if isinstance(e, ev.CaptureProgress) and e.phase == "decode"}
    assert not progress[4].ok and progress[4].failure_reason == "RuntimeError: boom"
    assert progress[1].ok and progress[2].ok
    (finished,) = [e for e in events if isinstance(e, ev.CaptureFinished) and e.phase == "decode"]
    assert not finished.ok and finished.failed == (4,) and finished.captured == (1, 2)
    assert "4" in finished.failure_reason and "boom" in finished.failure_reason
    for s in steps_of(events, "decode"):
        expected = "capture_failed" if s.batch_size == 3 else None
        assert s.fallback_reason == expected
    assert any(s.batch_size == 3 for s in steps_of(events, "decode"))
    assert tokens == eager_reference(prompts, max_new)
    assert [(c.bucket, c.ok) for c in engine.capture_ledger() if c.phase == "decode"] == [
        (1, True),
        (2, True),
        (4, False),
    ]


def test_no_graphs_captured(llama, make_engine):
    """The phase is enabled, but no bucket survives the limits (2-token chunks are below every prefill
    bucket; an unlocked empty decode list stays empty)."""
    engine, _, events = serve(make_engine, llama, PROMPTS[:2], 3, chunked_prefill_size=2)
    assert engine.prefill_buckets == [] and engine.decode_buckets == [1, 2, 4, 8]
    assert reasons(events, "prefill") == {"no_graphs_captured"} and reasons(events, "decode") == {None}
    engine, _, events = serve(make_engine, llama, PROMPTS[:2], 3, graphs=GraphConfig(decode_bs=[]))
    assert engine.decode_buckets == []
    assert reasons(events, "decode") == {"no_graphs_captured"} and reasons(events, "prefill") == {None}


def test_no_cuda_graphs_without_emulation(llama, make_engine, eager_reference):
    """On a CPU with emulation off, both phases serve eagerly and say why; tokens are unchanged."""
    cfg = GraphConfig()
    cfg.emulate = False
    engine, tokens, events = serve(make_engine, llama, PROMPTS[:3], 6, graphs=cfg)
    assert reasons(events) == {"no_cuda_graphs"}
    assert all(s.path == "eager" and not s.emulated for s in steps_of(events))
    assert engine.info.decode_graph_backend == "off (no CUDA graphs)" and engine.decode_buckets == []
    assert tokens == eager_reference(PROMPTS[:3], 6)


def test_every_reason_has_a_guard():
    """Each FallbackReason is produced by some test (above, not_yet_captured in
    test_serve_while_capturing.py, kernels_compiling in test_kernel_gate.py): no reason is dead."""
    produced = {
        "phase_disabled",
        "exceeds_max_bucket",
        "prefill_tokens_over_max_bucket",
        "prefill_padding_over_cap",
        "context_exceeds_graph",
        "capture_failed",
        "recapture_in_progress",
        "no_graphs_captured",
        "no_cuda_graphs",
        "not_yet_captured",
        "kernels_compiling",
    }
    assert produced == {r.value for r in FallbackReason}


# --- graph == eager -----------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_graph_path_equals_eager_path(tiny_ckpt, make_engine, family):
    path = tiny_ckpt(family)
    prompts = PROMPTS + ["x " * 40]  # 8 + a prompt longer than one chunk
    max_new = [20, 6, 15, 30, 9, 25, 12, 18, 10]
    schedule = {0: [0, 1, 2], 3: [3, 4], 6: [5], 9: [6, 7, 8]}
    kw = dict(chunked_prefill_size=32, max_running_requests=8, schedule=schedule)
    _, want, eager_events = serve(make_engine, path, prompts, max_new, graphs=False, **kw)
    _, got, events = serve(make_engine, path, prompts, max_new, **kw)
    assert got == want
    graph_steps = [s for s in steps_of(events) if s.path == "graph"]
    assert {s.phase for s in graph_steps if s.padded} == {"decode", "prefill"}  # padding on both phases
    assert len(steps_of(events)) == len(steps_of(eager_events))  # same schedule, step for step
    eager = [s for s in steps_of(events) if s.path == "eager"]
    assert len(graph_steps) >= 0.9 * len(steps_of(events)), eager
    assert all(s.fallback_reason for s in eager)
    assert {s.batch_size for s in steps_of(events, "decode")} >= {3, 5, 6, 7}


# --- live recapture -----------------------------------------------------------------------------


def test_recapture_with_requests_in_flight_loses_no_token(llama, make_engine, eager_reference, monkeypatch):
    monkeypatch.setattr(model_runner_mod, "RECAPTURE_SLICE_S", 0.0)  # one bucket per step boundary
    prompts, max_new = PROMPTS, [40, 35, 30, 38, 25, 40, 33, 36]
    want = eager_reference(prompts, max_new)
    bus = EventBus()
    sub = bus.subscribe("t")
    engine = make_engine(llama, bus=bus, chunked_prefill_size=16)
    handles = [
        engine.submit(p, SamplingParams(max_new_tokens=m, ignore_eos=True)) for p, m in zip(prompts[:6], max_new)
    ]
    for _ in range(8):
        engine.step()
    assert any(h.token_ids for h in handles) and not any(h.finished for h in handles)
    engine.recapture(decode_bs=[1, 2, 3, 5, 8], prefill_num_tokens=[8, 16])
    engine.step()
    handles += [
        engine.submit(p, SamplingParams(max_new_tokens=m, ignore_eos=True)) for p, m in zip(prompts[6:], max_new[6:])
    ]  # arrive mid-recapture
    engine.run_until_idle()
    assert [h.token_ids for h in handles] == want
    assert [len(h.token_ids) for h in handles] == max_new
    assert engine.decode_buckets == [1, 2, 3, 5, 8] and engine.prefill_buckets == [8, 16]

    events = sub.drain()
    for e in events:
        ev.validate_event_dict(json.loads(json.dumps(e.to_dict())))
    (requested,) = [e for e in events if isinstance(e, ev.RecaptureRequested)]
    (finished,) = [e for e in events if isinstance(e, ev.RecaptureFinished)]
    assert requested.decode_bs == (1, 2, 3, 5, 8) and requested.prefill_num_tokens == (8, 16)
    assert finished.ok and finished.decode_bs == (1, 2, 3, 5, 8) and finished.prefill_num_tokens == (8, 16)
    recap = [e for e in events if isinstance(e, ev.CaptureStarted) and e.reason == "recapture"]
    assert sorted(e.phase for e in recap) == ["decode", "prefill"]
    steps = steps_of(events)
    during = [s for s in steps if s.fallback_reason == "recapture_in_progress"]
    assert during and all(s.path == "eager" for s in during)
    after = [s for s in steps if s.ts > finished.ts]
    assert after and all(s.path == "graph" for s in after)
    assert {s.bucket for s in after if s.phase == "decode"} <= {1, 2, 3, 5, 8}
    assert any(s.bucket in (3, 5) for s in after if s.phase == "decode")  # the new buckets serve


def test_recapture_in_background_mode(llama, make_engine, eager_reference):
    prompts, max_new = PROMPTS[:5], 60
    want = eager_reference(prompts, max_new)
    engine = make_engine(llama)
    engine.start_background()
    try:
        handles = [engine.submit(p, SamplingParams(max_new_tokens=max_new, ignore_eos=True)) for p in prompts]
        deadline = time.monotonic() + 30
        while not handles[0].token_ids and time.monotonic() < deadline:
            time.sleep(0.001)
        engine.recapture(decode_bs=[2, 5])  # from this thread, while the engine thread decodes
        assert all(h.wait(60) for h in handles)
    finally:
        engine.shutdown()
    assert [h.token_ids for h in handles] == want
    assert engine.decode_buckets == [2, 5] and engine.last_error is None


@pytest.mark.parametrize(
    "decode_bs,prefill_tokens,message",
    [
        ([], None, "decode buckets: empty: give at least one bucket, e.g. 1,2,4,8-64:8"),
        ([0, 2], None, "decode buckets: '0': buckets must be ≥ 1"),
        ([-1], None, "decode buckets: '-1': buckets must be ≥ 1"),
        ([1, 100], None, "decode buckets: bucket 100 is over the static buffers' maximum (8)"),
        ([1.5], None, "decode buckets: '1.5' is not an integer"),
        (None, [10000], "prefill buckets: bucket 10000 is over the static buffers' maximum (64)"),
        (None, [], "prefill buckets: empty: give at least one bucket, e.g. 1,2,4,8-64:8"),
        (None, None, "recapture needs a decode or a prefill bucket list"),
    ],
)
def test_invalid_recapture_keeps_old_graphs(llama, make_engine, decode_bs, prefill_tokens, message):
    bus = EventBus()
    sub = bus.subscribe("t", types=["recapture_finished", "step", "capture_started"])
    engine = make_engine(llama, bus=bus)
    old = (engine.decode_buckets, engine.prefill_buckets)
    engine.recapture(decode_bs=decode_bs, prefill_num_tokens=prefill_tokens)
    engine.generate(PROMPTS[:3], SamplingParams(max_new_tokens=4, ignore_eos=True))
    events = sub.drain()
    (finished,) = [e for e in events if isinstance(e, ev.RecaptureFinished)]
    assert not finished.ok and finished.message == message
    assert (list(finished.decode_bs), list(finished.prefill_num_tokens)) == old
    assert (engine.decode_buckets, engine.prefill_buckets) == old
    assert not [e for e in events if isinstance(e, ev.CaptureStarted) and e.reason == "recapture"]
    assert {(s.path, s.fallback_reason) for s in steps_of(events)} == {("graph", None)}


def test_recapture_of_a_disabled_phase_is_refused(llama, make_engine):
    bus = EventBus()
    sub = bus.subscribe("t", types=["recapture_finished"])
    engine = make_engine(llama, bus=bus, graphs=locked({"decode.backend": "disabled"}))
    engine.recapture(decode_bs=[1, 2])
    engine.step()
    (finished,) = sub.drain()
    assert not finished.ok and finished.message == "decode graphs are disabled; nothing to recapture"


# --- the static-buffer contract -------------------------------------------------------------------


@pytest.mark.parametrize(
    "phase,buffer",
    [("decode", "seq_lens"), ("decode", "input_ids"), ("prefill", "positions"), ("prefill", "bridge_out")],
)
def test_reallocated_static_buffer_is_caught(llama, make_engine, phase, buffer):
    engine = make_engine(llama)
    engine.submit(PROMPTS[0], SamplingParams(max_new_tokens=5, ignore_eos=True))
    runner = engine.model_runner.decode if phase == "decode" else engine.model_runner.prefill
    if phase == "decode":
        engine.step()  # the prefill; the next step is a decode
    if buffer == "bridge_out":
        runner.bridges.output = runner.bridges.output.clone()
    else:
        runner.registry.buffers[buffer] = runner.registry.buffers[buffer].clone()
    with pytest.raises(StaticBufferError, match=f"static buffer '{buffer}' moved"):
        engine.step()


def test_output_outside_the_static_output_buffer_is_caught(llama, make_engine, monkeypatch):
    engine = make_engine(llama)
    engine.submit(PROMPTS[0], SamplingParams(max_new_tokens=5, ignore_eos=True))
    engine.step()  # the prefill; the next step is a decode
    runner = engine.model_runner.decode
    real = runner._forward
    monkeypatch.setattr(runner, "_forward", lambda bs: real(bs).clone())  # a fresh tensor every replay
    with pytest.raises(StaticBufferError, match="is not the static output buffer"):
        engine.step()


def test_emulated_capture_runs_each_runner_once_and_records_every_bucket(llama, make_engine, monkeypatch):
    """An emulated replay re-runs the function, so capture records the contract (static buffer addresses,
    where the output lives) and runs the function once per runner, at its smallest bucket."""
    from graphtop.engine.graphs.runners.prefill_graph import PrefillGraphRunner

    ran: list[tuple[str, int]] = []
    for cls in (DecodeGraphRunner, PrefillGraphRunner):
        real = cls._forward
        monkeypatch.setattr(cls, "_forward", lambda self, n, real=real: ran.append((self.phase, n)) or real(self, n))
    engine = make_engine(llama)
    assert ran == [("decode", 1), ("prefill", 4)]  # no eager warm-up either: nothing to compile on a CPU
    for runner in (engine.model_runner.decode, engine.model_runner.prefill):
        assert sorted(k.size for k in runner.backend.keys()) == runner.buckets == runner.configured
        assert set(runner.backend.addresses[max(runner.backend.keys())]) >= set(runner.registry.buffers)
    ran.clear()
    engine.recapture(decode_bs=[2, 8])
    engine.run_until_idle()
    assert ran == [("decode", 2)] and engine.decode_buckets == [2, 8]


# --- capture with the GC frozen ------------------------------------------------------------------


@pytest.mark.parametrize("freeze", [True, False])
def test_capture_runs_with_the_gc_frozen(llama, make_engine, monkeypatch, freeze):
    """Every bucket, of the initial capture and of each recapture slice, is captured inside the
    backend's capture_session (GC frozen), and the GC is thawed between slices; no full collection."""
    import gc

    from graphtop.engine.graphs.runners.bucketed import BucketedGraphRunner

    monkeypatch.setattr(model_runner_mod, "RECAPTURE_SLICE_S", 0.0)  # one bucket per step boundary
    frozen_at_capture: list[tuple[str, int, int]] = []
    real_capture = BucketedGraphRunner._capture_stages
    collects = []
    real_collect = gc.collect

    def capture(self, size):
        frozen_at_capture.append((self.phase, size, gc.get_freeze_count()))
        return real_capture(self, size)

    monkeypatch.setattr(BucketedGraphRunner, "_capture_stages", capture)
    monkeypatch.setattr(gc, "collect", lambda *a: collects.append(1) or real_collect(*a))
    engine = make_engine(llama, graphs=GraphConfig(freeze_gc=freeze, decode_bs=[1, 2, 4], prefill_num_tokens=[8, 16]))
    engine.submit(PROMPTS[0], SamplingParams(max_new_tokens=6, ignore_eos=True))
    engine.step()
    engine.recapture(decode_bs=[1, 3], prefill_num_tokens=[16])
    engine.step()
    assert gc.get_freeze_count() == 0  # thawed between slices: serving steps run with a normal GC
    engine.run_until_idle()
    assert engine.decode_buckets == [1, 3] and engine.prefill_buckets == [16]
    assert sorted((p, s) for p, s, _ in frozen_at_capture) == sorted(
        [
            ("decode", 1),
            ("decode", 2),
            ("decode", 4),
            ("prefill", 8),
            ("prefill", 16),
            ("decode", 1),
            ("decode", 3),
            ("prefill", 16),
        ]
    )
    assert all((n > 0) == freeze for _, _, n in frozen_at_capture)
    assert collects == []  # freezing walks nothing: a collection per job cost more than it saved
    assert gc.get_freeze_count() == 0
