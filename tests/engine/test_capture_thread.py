"""Capture on a thread of its own (engine/runners/capture_thread.py): steps go on while graphs are captured.

Each test makes the capture wait for something only steps can do (steps delivered, a step that found the
runner busy), so an engine whose steps waited for a capture would hang instead of passing; tokens equal
those of an engine that captured everything first.
"""

from __future__ import annotations

import threading
import time

import pytest

from graphtop.engine.graphs.config import build_graph_config
from graphtop.engine.runners.bucketed import BucketedGraphRunner
from graphtop.engine.runners.capture import CaptureJob
from graphtop.engine.runners.capture_thread import DeviceTurn
from graphtop.engine.sampling_params import SamplingParams
from graphtop.engine.telemetry import events as ev
from graphtop.engine.telemetry.bus import EventBus

pytestmark = pytest.mark.usefixtures("torch_one_thread")

PROMPTS = ["Once upon a time", "The quick brown fox jumps over", "hello", "a b c d e f g h i j k"]
MAX_NEW = [24, 18, 30, 12]
WAIT_S = 60.0  # a bound on every wait: a step loop that waited for the capture fails instead of hanging


@pytest.fixture(scope="module")
def llama(tiny_ckpt):
    return tiny_ckpt("llama")


def serve(engine, bus_sub, prompts=PROMPTS, max_new=MAX_NEW):
    handles = [engine.submit(p, SamplingParams(max_new_tokens=m, ignore_eos=True)) for p, m in zip(prompts, max_new)]
    engine.run_until_done(handles)
    while engine.capture_pending:  # the rest of the capture, idle
        engine.step()
    return [h.token_ids for h in handles], bus_sub.drain()


def reference(make_engine, path, prompts=PROMPTS, max_new=MAX_NEW):
    engine = make_engine(path, capture_before_serving=True)
    handles = [engine.submit(p, SamplingParams(max_new_tokens=m, ignore_eos=True)) for p, m in zip(prompts, max_new)]
    engine.run_until_done(handles)
    return [h.token_ids for h in handles]


def wait_until(cond, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.002)


def test_steps_are_delivered_while_a_bucket_is_being_captured(llama, make_engine, monkeypatch):
    """The first bucket's capture waits until five steps were delivered: they can only have run beside it."""
    engines: list = []
    threads: list[str] = []
    real = BucketedGraphRunner._capture_stages

    def capture(self, size):
        threads.append(threading.current_thread().name)
        if len(threads) == 1:  # the engine's first capture
            wait_until(lambda: engines and engines[0].loop.step_no >= 5, "five steps beside a capture")
        return real(self, size)

    monkeypatch.setattr(BucketedGraphRunner, "_capture_stages", capture)
    bus = EventBus()
    sub = bus.subscribe("t")
    engine = make_engine(llama, bus=bus, capture_before_serving=False, capture_thread=True)
    engines.append(engine)
    got, events = serve(engine, sub)
    monkeypatch.undo()
    assert got == reference(make_engine, llama)
    assert set(threads) == {"graphtop-capture"}
    steps = [e for e in events if isinstance(e, ev.StepEvent)]
    allowed = {None, "not_yet_captured", "capture_running", "prefill_padding_over_cap"}
    assert {s.fallback_reason for s in steps} <= allowed
    finished = [e for e in events if isinstance(e, ev.CaptureFinished)]
    assert {e.phase for e in finished} == {"decode", "prefill"} and all(e.ok for e in finished)
    assert engine.decode_buckets == [1, 2, 4, 8]


def test_a_live_bucket_runs_eagerly_while_the_thread_records_another(llama, make_engine, monkeypatch):
    """While the thread records decode bucket 2 (bucket 1 is live), a one-request decode step finds the graph
    runners busy: it runs eagerly with ``capture_running`` instead of waiting; then it replays bucket 1."""
    engines: list = []
    real = BucketedGraphRunner._capture_stages
    backend_capture: dict = {}

    def capture(self, size):
        if self.phase == "decode" and size == 2:
            runner, backend = self, self.backend
            real_one = backend.capture_one

            def held_capture_one(key, fn):  # called with the graph runners' lock held
                assert runner.lock.locked()
                wait_until(lambda: engines and busy_steps(), "a step that found the runner busy")
                return real_one(key, fn)

            backend_capture["patched"] = True
            monkeypatch.setattr(backend, "capture_one", held_capture_one)
            try:
                yield from real(self, size)
            finally:
                monkeypatch.setattr(backend, "capture_one", real_one)
            return
        yield from real(self, size)

    seen: list[ev.StepEvent] = []

    def busy_steps() -> bool:
        seen.extend(e for e in sub.drain() if isinstance(e, ev.StepEvent))
        return any(s.fallback_reason == "capture_running" for s in seen)

    monkeypatch.setattr(BucketedGraphRunner, "_capture_stages", capture)
    bus = EventBus()
    sub = bus.subscribe("t", types={"step"})
    graphs = build_graph_config(None, {"decode.bs": [1, 2]})
    engine = make_engine(llama, bus=bus, graphs=graphs, capture_before_serving=False, capture_thread=True)
    engines.append(engine)
    handle = engine.submit(PROMPTS[0], SamplingParams(max_new_tokens=60, ignore_eos=True))
    engine.run_until_done([handle])
    while engine.capture_pending:
        engine.step()
    monkeypatch.undo()
    assert backend_capture.get("patched")
    busy = [s for s in seen if s.fallback_reason == "capture_running"]
    assert busy and all(s.path == "eager" and s.phase == "decode" and s.batch_size == 1 for s in busy)
    later = [s for s in seen + [e for e in sub.drain() if isinstance(e, ev.StepEvent)] if s.step > busy[-1].step]
    assert any(s.path == "graph" and s.bucket == 1 for s in later)
    want = reference(make_engine, llama, [PROMPTS[0]], [60])
    assert [handle.token_ids] == want


def test_close_while_capturing_stops_the_thread(llama, make_engine, monkeypatch):
    real = BucketedGraphRunner._capture_stages
    started = threading.Event()

    def slow(self, size):
        started.set()
        time.sleep(0.05)
        return real(self, size)

    monkeypatch.setattr(BucketedGraphRunner, "_capture_stages", slow)
    engine = make_engine(llama, capture_before_serving=False, capture_thread=True)
    assert started.wait(WAIT_S)
    thread = engine.model_runner.capture_thread
    assert thread is not None and thread.running
    engine.close()
    assert not thread.running


def test_a_failing_capture_thread_leaves_named_eager_steps(llama, make_engine, monkeypatch):
    """Anything a bucket's own failure handling does not catch ends the thread's job: the buckets left are
    failed with the reason, and their steps run eagerly as ``capture_failed``."""

    def broken(self, start, budget_s):
        raise RuntimeError("gate broke")

    monkeypatch.setattr(CaptureJob, "_kernels_ready", broken)
    bus = EventBus()
    sub = bus.subscribe("t")
    engine = make_engine(llama, bus=bus, capture_before_serving=False, capture_thread=True)
    assert engine.wait_for_capture(timeout=WAIT_S)  # over at once: the thread gave every bucket up
    got, events = serve(engine, sub, PROMPTS[:2], MAX_NEW[:2])
    monkeypatch.undo()
    assert engine.decode_buckets == [] and not engine.capture_pending
    finished = [e for e in events if isinstance(e, ev.CaptureFinished)]
    assert finished and all(not e.ok and "the capture thread failed" in e.failure_reason for e in finished)
    steps = [e for e in events if isinstance(e, ev.StepEvent)]
    assert steps and {s.fallback_reason for s in steps} == {"capture_failed"}
    assert got == reference(make_engine, llama, PROMPTS[:2], MAX_NEW[:2])


def test_the_device_turn_goes_to_the_capture_thread_once_it_asks():
    """A step in progress keeps the turn; once the capture thread asks, the next step waits for its turn."""
    import torch

    turn = DeviceTurn(torch.device("cpu"))
    turn.active = True
    order: list[str] = []
    in_step, asked, captured = threading.Event(), threading.Event(), threading.Event()

    def capture_side() -> None:
        asked.set()
        with turn.capture(None):
            order.append("capture")
        captured.set()

    with turn.step():
        order.append("step 1")
        helper = threading.Thread(target=capture_side)
        helper.start()
        assert asked.wait(WAIT_S)
        wait_until(lambda: turn._capture_asks, "the capture thread's ask")
        in_step.set()
        assert not captured.is_set()  # it waits for the step in progress
    with turn.step():  # the capture thread goes first
        order.append("step 2")
    helper.join(WAIT_S)
    assert order == ["step 1", "capture", "step 2"]
