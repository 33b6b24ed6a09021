"""Online parity checks on CPU (emulated graphs): they never change outputs, and they catch a graph that
reads a stale static buffer."""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
from typing import TYPE_CHECKING, Iterator

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from graphtop.engine.graphs.buffers import PaddingPolicy
from graphtop.engine.graphs.config import build_graph_config
from graphtop.engine.parity.checker import SWITCH_INTERVAL_S, compare_rows, summarize_rows
from graphtop.engine.parity.scratch import scratch_batch
from graphtop.engine.request import FinishReason
from graphtop.engine.sampling_params import SamplingParams
from graphtop.engine.telemetry import events as ev
from graphtop.engine.telemetry.bus import EventBus
from graphtop.engine.telemetry.value_limits import MAX_FLOAT
from graphtop.engine.trace_tools.report import format_summary
from graphtop.engine.trace_tools.summary import summarize

if TYPE_CHECKING:
    from graphtop.engine.engine import Engine

pytestmark = pytest.mark.usefixtures("torch_one_thread")

GRAPHS = {"decode.bs": [1, 2, 4, 8], "prefill.num_tokens": [16, 32, 64]}
PROMPTS = [[10 + (i * 7 + j) % 50 for j in range(n)] for i, n in enumerate([5, 12, 30, 9, 21, 3])]
MAX_NEW = [9, 14, 6, 11, 8, 12]


_opened: list[Engine] = []  # engines this module's tests made, closed after each test (see _close_engines)


@pytest.fixture(autouse=True)
def _close_engines() -> Iterator[None]:
    """Close every engine a test opened, also when the test fails: an engine left open keeps its parity
    worker registered with ``Paced`` and the interpreter's switch interval lowered, which fails the
    pacing tests after it. ``Engine.close`` is idempotent, so tests still close their own."""
    yield
    while _opened:
        _opened.pop().close()


def _engine(tiny_ckpt, make_engine, bus=None, **kw) -> Engine:
    engine = make_engine(tiny_ckpt("qwen3"), bus=bus, graphs=build_graph_config(None, GRAPHS), **kw)
    _opened.append(engine)
    return engine


def _serve(engine, *, settle_checks: bool = False) -> list[list[int]]:
    """Requests arriving one every other step (prefills between decode steps of a changing batch), some
    finishing while others run; ``settle_checks`` waits for each check, so every due step is checked."""
    handles = []
    pending = list(zip(PROMPTS, MAX_NEW))
    while pending or engine.scheduler.has_work():
        if pending:
            p, m = pending.pop(0)
            handles.append(engine.submit(p, SamplingParams(max_new_tokens=m, ignore_eos=True, detokenize=False)))
        for _ in range(2):
            engine.step()
            if settle_checks:
                engine.parity.wait_idle()
    engine.parity.wait_idle()
    return [h.token_ids for h in handles]


def _checks(events) -> list[ev.ParityCheck]:
    return [e for e in events if isinstance(e, ev.ParityCheck)]


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("page_size", [1, 4])
def test_parity_every_1_changes_no_output_token(tiny_ckpt, make_engine, overlap, page_size) -> None:
    plain = _engine(tiny_ckpt, make_engine, overlap_schedule=overlap, page_size=page_size)
    expected = _serve(plain)
    plain.close()
    for settle in (False, True):  # the worker racing the step loop, and every due step checked
        bus = EventBus()
        sub = bus.subscribe("t")
        checked = _engine(tiny_ckpt, make_engine, bus, overlap_schedule=overlap, page_size=page_size, parity_every=1)
        device_ids = []  # checks of overlapped steps, whose input ids were still on the device
        snapshot = checked.parity._snapshot_ids
        checked.parity._snapshot_ids = lambda ids: device_ids.append(ids) or snapshot(ids)
        assert _serve(checked, settle_checks=settle) == expected
        used = checked.pool.used_pages
        checked.close()
        checks = _checks(sub.drain())
        assert checks and not any(c.mismatch for c in checks), checks
        assert used == 0  # the scratch pages are reserved, not used: nothing leaked
        if settle:
            assert {c.phase for c in checks} == {"decode", "prefill"}
            assert all(c.argmax_agree == 1.0 and c.top5_overlap == 1.0 for c in checks)
            assert bool(device_ids) == overlap  # overlapped steps were checked on the ids the device fed them


@pytest.mark.parametrize("phase, slot", [("decode", "positions"), ("prefill", "input_ids")])
def test_a_stale_static_buffer_is_caught(tiny_ckpt, make_engine, phase, slot) -> None:
    """After capture, the runner stops refreshing one static buffer (the graph reads what capture left
    there): the graph's logits go wrong, the eager re-run's do not, and the check says so."""
    bus = EventBus()
    sub = bus.subscribe("t")
    engine = _engine(tiny_ckpt, make_engine, bus, parity_every=1)
    runner = engine.model_runner.decode if phase == "decode" else engine.model_runner.prefill
    registry = runner.registry
    registry.slots[slot] = dataclasses.replace(registry.slots[slot], policy=PaddingPolicy.FILL_ONCE)
    _serve(engine, settle_checks=True)
    engine.close()
    events = sub.drain()
    bad = [c for c in _checks(events) if c.mismatch]
    assert bad and {c.phase for c in bad} == {phase}, _checks(events)
    assert all(c.max_rel_err > c.tolerance for c in bad)
    report = format_summary(summarize(events))
    assert "MISMATCH" in report and f"mismatches {len(bad)}" in report


def test_a_check_whose_context_is_freed_midway_compares_only_the_rows_still_held(tiny_ckpt, make_engine) -> None:
    bus = EventBus()
    sub = bus.subscribe("t")
    engine = _engine(tiny_ckpt, make_engine, bus, parity_every=1, overlap_schedule=False)
    eager = engine.parity._eager
    run = eager.run
    gate, started = threading.Event(), threading.Event()

    def held_run(batch):
        started.set()
        gate.wait(10)
        return run(batch)

    def hold_a_check_then_cancel(request_id: str) -> None:
        gate.clear()
        started.clear()
        eager.run = held_run
        engine.step()  # a decode step: its check starts and waits at the gate
        assert started.wait(10) and engine.parity.busy
        engine.cancel(request_id)
        engine.step()  # frees that request's pages while the check still runs
        eager.run = run
        gate.set()
        engine.parity.wait_idle()

    params = SamplingParams(max_new_tokens=40, ignore_eos=True, detokenize=False)
    a, b = engine.submit(PROMPTS[0], params), engine.submit(PROMPTS[1], params)
    while not (a.token_ids and b.token_ids):
        engine.step()
        engine.parity.wait_idle()
    sub.drain()
    hold_a_check_then_cancel(a.request_id)
    checks = _checks(sub.drain())
    assert [(c.batch_size, c.rows) for c in checks][:1] == [(2, 1)]  # only b's row was compared
    assert engine.parity.discarded == 0
    hold_a_check_then_cancel(b.request_id)  # b alone: nothing left to compare
    engine.close()
    events = sub.drain()
    assert engine.parity.discarded == 1 and not _checks(events)
    # the stream says so at once, not only in a later check's counts (there is none here)
    not_run = [e for e in events if isinstance(e, ev.ParityNotRun)]
    assert [(e.reason, e.discarded, e.step is not None) for e in not_run] == [("discarded", 1, True)]
    summary = summarize(events)
    assert summary.parity.discarded == 1 and summary.parity.checks == 0
    assert "none compared" in format_summary(summary) and "discarded 1" in format_summary(summary)


@pytest.mark.parametrize("reason", ["too_large", "capture_pending"])
def test_a_due_check_that_cannot_run_is_an_event_with_its_reason(tiny_ckpt, make_engine, monkeypatch, reason) -> None:
    """A due check skipped for want of scratch KV, or while a recapture waits, is a ``parity_not_run``
    event with the running counts; only a skip behind a running check is left to that check's event."""
    import graphtop.engine.parity.checker as parity_mod

    bus = EventBus()
    sub = bus.subscribe("t")
    engine = _engine(tiny_ckpt, make_engine, bus, parity_every=1)
    if reason == "too_large":
        monkeypatch.setattr(parity_mod, "pages_needed", lambda batch: 1 << 30)
    else:
        monkeypatch.setattr(type(engine.model_runner), "capture_pending", property(lambda self: True))
    handle = engine.submit(PROMPTS[2], SamplingParams(max_new_tokens=5, ignore_eos=True, detokenize=False))
    for _ in range(50):
        if handle.finished:
            break
        engine.step()
    engine.parity.wait_idle()
    events = sub.drain()
    not_run = [e for e in events if isinstance(e, ev.ParityNotRun)]
    assert handle.token_ids and not _checks(events) and not_run
    assert all(e.reason == reason and e.step is None and e.every == 1 for e in not_run)
    assert (
        [e.skipped for e in not_run]
        == list(range(1, len(not_run) + 1))
        == [engine.parity.skipped - i for i in range(len(not_run) - 1, -1, -1)]
    )


def test_switching_on_and_off_between_steps(tiny_ckpt, make_engine) -> None:
    bus = EventBus()
    sub = bus.subscribe("t")
    engine = _engine(tiny_ckpt, make_engine, bus)
    capacity, interval = engine.pool.capacity_tokens, sys.getswitchinterval()
    engine.set_parity_every(2)
    engine.run_until_idle()  # applies the command
    assert engine.parity_every == 2 and engine.pool.capacity_tokens < capacity  # scratch reserved
    assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)  # the step loop gets the GIL back quickly
    assert engine.output.kv_capacity_tokens == engine.pool.capacity_tokens
    for prompt in PROMPTS[:2]:
        engine.submit(prompt, SamplingParams(max_new_tokens=6, ignore_eos=True))
    # Each check settles before the next step. Unsettled (``generate``), a check still running when
    # its requests finish is discarded (their pages were freed under it) and the one due meanwhile is
    # skipped: a worker slower than the 3 decode steps left after the first due one publishes nothing.
    while engine.step():
        engine.parity.wait_idle()
    assert {c.every for c in _checks(sub.drain())} == {2}
    assert engine.parity.skipped == engine.parity.discarded == 0
    engine.set_parity_every(0)
    engine.run_until_idle()
    assert engine.parity_every == 0 and engine.pool.capacity_tokens == capacity
    assert sys.getswitchinterval() == interval
    with pytest.raises(ValueError):
        engine.set_parity_every(-1)
    engine.close()


def test_a_paced_rerun_runs_its_layers_only_while_the_step_loop_waits_on_the_device(
    tiny_ckpt, make_engine, monkeypatch
) -> None:
    """As on a GPU: the worker's re-run waits before each layer for a device wait of the step loop, so
    its Python does not compete with the step loop's; the step loop's own forwards pass straight on."""
    import time

    import graphtop.engine.parity.pacing as pacing

    monkeypatch.setattr(pacing, "PACE_WAIT_S", 30.0)  # no timeout lets a layer through in this test
    bus = EventBus()
    sub = bus.subscribe("t")
    engine = _engine(tiny_ckpt, make_engine, bus, overlap_schedule=False, capture_before_serving=True)
    checker, decoder = engine.parity, engine.model.model
    checker.pacing = True
    n_layers = len(decoder.layers)
    engine.set_parity_every(n_layers)
    engine.run_until_idle()
    assert not checker.paces  # a check due every `layers` steps or more often runs unpaced
    engine.set_parity_every(n_layers + 1)
    engine.run_until_idle()
    assert checker.paces and decoder.before_layer == pacing.Paced.before_layer
    engine.submit(list(range(10, 25)), SamplingParams(max_new_tokens=n_layers + 4, ignore_eos=True, detokenize=False))
    waits: list[float] = []
    monkeypatch.setattr(checker, "while_device_busy", lambda wait: waits.append(0.0) or wait())  # shut the window
    for _ in range(n_layers + 1):  # the prefill (bucket 16) and decode steps: graph steps, the last one checked
        engine.step()  # its sampling opens no window
    job = checker._running
    assert job is not None and waits
    time.sleep(0.3)
    assert not job.finished.is_set()  # held before its first layer
    monkeypatch.undo()
    deadline = time.monotonic() + 30.0  # windows until it is done: a loaded host may let a window pass unused
    while not job.finished.is_set() and time.monotonic() < deadline:
        checker.while_device_busy(lambda: time.sleep(0.05))  # the step loop blocking on the device
    assert job.finished.is_set() and job.error is None
    engine.parity.wait_idle()
    assert [c.mismatch for c in _checks(sub.drain())] == [False]
    engine.set_parity_every(0)
    engine.run_until_idle()
    assert decoder.before_layer is None and not pacing.Paced.registered()
    engine.close()


def test_engines_sharing_a_model_each_pace_their_own_worker(tiny_ckpt) -> None:
    from graphtop.engine.config import EngineConfig
    from graphtop.engine.engine import Engine
    from graphtop.engine.parity.pacing import Paced
    from graphtop.models import load_checkpoint

    ckpt = load_checkpoint(tiny_ckpt("qwen3"))
    config = EngineConfig(
        device="cpu",
        dtype="float32",
        max_total_tokens=4096,
        max_running_requests=8,
        chunked_prefill_size=64,
        graphs=build_graph_config(None, GRAPHS),
    )
    first, second = Engine(ckpt, config, EventBus()), Engine(ckpt, config, EventBus())
    _opened.extend((first, second))
    assert first.model is second.model  # one checkpoint, one module
    for engine in (first, second):
        engine.set_parity_every(4)
        engine.run_until_idle()
    assert Paced.registered() == {
        first.parity._worker_ident: first.parity._device_waits,
        second.parity._worker_ident: second.parity._device_waits,
    }
    assert first.model.model.before_layer == Paced.before_layer
    first.set_parity_every(0)
    first.run_until_idle()
    assert first.model.model.before_layer == Paced.before_layer  # the second still checks
    second.close()
    assert first.model.model.before_layer is None and not Paced.registered()
    first.close()


def test_the_hook_leaves_a_model_with_its_last_checker() -> None:
    """Two checkers on one model and one on another: each model keeps the hook while one of its own
    checkers runs, whatever the other model's checkers do."""
    from types import SimpleNamespace

    from graphtop.engine.parity.pacing import DeviceWaits, Paced

    shared, other = SimpleNamespace(before_layer=None), SimpleNamespace(before_layer=None)
    Paced.attach(shared, 101, DeviceWaits())
    Paced.attach(shared, 102, DeviceWaits())
    Paced.attach(other, 103, DeviceWaits())
    Paced.attach(SimpleNamespace(), 104, DeviceWaits())  # no hook on this architecture: not registered
    assert sorted(Paced.registered()) == [101, 102, 103]
    Paced.detach(101)
    assert shared.before_layer == Paced.before_layer  # 102 still checks on it
    Paced.detach(102)
    assert shared.before_layer is None and other.before_layer == Paced.before_layer
    Paced.detach(103)
    Paced.detach(None)  # a checker that never started its worker
    assert other.before_layer is None and not Paced.registered()


def test_device_waits_let_one_layer_through_per_wait() -> None:
    """A worker that finished a layer waits for the step loop's next device wait, not the one still
    open; with none coming, the timeout lets the layer go ahead."""
    import time

    from graphtop.engine.parity.pacing import DeviceWaits

    waits = DeviceWaits()
    assert not waits.next_layer(0.01)  # no device wait at all: goes ahead after the timeout
    layers: list[bool] = []
    first_taken = threading.Event()

    def worker() -> None:
        layers.append(waits.next_layer(5.0))  # the first wait
        first_taken.set()
        layers.append(waits.next_layer(0.05))  # the same wait, still open: times out
        layers.append(waits.next_layer(5.0))  # the next wait

    thread = threading.Thread(target=worker)
    thread.start()
    waits.during(lambda: first_taken.wait(5.0) and time.sleep(0.2))  # one long device wait
    time.sleep(0.05)
    waits.during(lambda: time.sleep(0.05))
    thread.join(5.0)
    assert layers == [True, False, True]
    waits.enabled = False
    assert not waits.next_layer(10.0)  # off: never waits


def test_too_little_free_kv_for_scratch_is_an_error_event(tiny_ckpt, make_engine) -> None:
    bus = EventBus()
    sub = bus.subscribe("t")
    engine = _engine(tiny_ckpt, make_engine, bus, max_total_tokens=256)
    hog = engine.pool.reserve(engine.pool.free_pages)
    engine.set_parity_every(4)
    engine.run_until_idle()
    errors = [e for e in sub.drain() if isinstance(e, ev.ErrorEvent)]
    assert engine.parity_every == 0 and errors and "free KV pages" in errors[0].message
    engine.pool.unreserve(hog)
    engine.close()


def test_checks_that_would_leave_an_accepted_request_no_room_are_refused(tiny_ckpt, make_engine) -> None:
    """A prompt accepted against the whole pool must still fit once scratch pages are reserved; it was
    preempted and readmitted forever (the run never ended)."""
    bus = EventBus()
    sub = bus.subscribe("t")
    engine = _engine(tiny_ckpt, make_engine, bus, max_total_tokens=80)
    capacity = engine.pool.capacity_tokens
    handle = engine.submit([5] * (capacity - 5), SamplingParams(max_new_tokens=3))
    engine.set_parity_every(1)
    done = threading.Event()
    worker = threading.Thread(target=lambda: (engine.run_until_idle(), done.set()), daemon=True)
    worker.start()
    assert done.wait(60), "the request never finished"
    errors = [e for e in sub.drain() if isinstance(e, ev.ErrorEvent)]
    assert handle.finish_reason is FinishReason.LENGTH and len(handle.token_ids) == 3
    assert engine.parity_every == 0 and errors and "fewer than a request in flight needs" in errors[0].message
    engine.set_parity_every(1)  # nothing in flight: now they go on
    engine.run_until_idle()
    assert engine.parity_every == 1 and engine.pool.capacity_tokens < capacity
    engine.close()


def test_compare_rows() -> None:
    e = torch.tensor([[1.0, 2.0, 3.0, 0.5, 0.1, -1.0], [4.0, 0.0, 1.0, 2.0, 3.0, -2.0]])
    assert summarize_rows(compare_rows(e.clone(), e).tolist()) == [0.0, 0.0, 1.0, 1.0]
    g = e.clone()
    g[1, 5] = 10.0  # row 1: argmax moves, one of eager's top 5 drops out, error 12 of max |4|
    rows = compare_rows(g, e).tolist()
    assert rows[0] == [0.0, 0.0, 1.0, 1.0] and rows[1][:3] == [12.0, 3.0, 0.0] and rows[1][3] == pytest.approx(0.8)
    max_abs, max_rel, agree, top5 = summarize_rows(rows)
    assert (max_abs, max_rel, agree) == (12.0, 3.0, 0.5) and top5 == pytest.approx(0.9)
    g[0, 0] = float("nan")
    worst = MAX_FLOAT  # a NaN is the worst error, not none, and within what a trace holds
    assert compare_rows(g, e)[0, :2].tolist() == [worst, worst]
    e2 = e.clone()
    e2[1, 0] = float("inf")  # eager itself non-finite: still the worst, never NaN or inf
    assert compare_rows(g, e2)[:, :2].isfinite().all() and compare_rows(g, e2)[1, 1].item() == worst


def test_a_parity_check_of_nan_logits_leaves_a_readable_trace(tmp_path) -> None:
    from graphtop.engine.telemetry.events import ParityCheck
    from graphtop.engine.telemetry.trace_writer import write_trace
    from graphtop.engine.trace_tools.trace import read_trace

    e = torch.tensor([[1.0, 2.0, 3.0, 0.5, 0.1, -1.0]])
    g = e.clone()
    g[0, 2] = float("nan")
    max_abs, max_rel, agree, top5 = summarize_rows(compare_rows(g, e).tolist())
    ev = ParityCheck(
        step=1,
        rows=1,
        max_abs_err=max_abs,
        max_rel_err=max_rel,
        argmax_agree=agree,
        top5_overlap=top5,
        tolerance=0.02,
        mismatch=max_rel > 0.02,
        ts=1.0,
    )
    path = tmp_path / "t.jsonl"
    assert write_trace(path, [ev]) == 1
    back = read_trace(path).events
    assert len(back) == 1 and back[0].mismatch and back[0].max_abs_err == max_abs


def test_scratch_batch_keeps_context_and_copies_a_shared_first_page() -> None:
    from array import array

    from graphtop.engine.batch import ForwardBatch, ForwardMode

    # page size 4; request A has 6 tokens cached (pages 7, 9) and adds 3; B has 4 cached and adds 1
    batch = ForwardBatch(
        ForwardMode.PREFILL,
        requests=[],
        input_ids=[1, 2, 3, 4],
        positions=[6, 7, 8, 4],
        out_cache_loc=[],
        seq_lens=[9, 5],
        extend_lens=[3, 1],
        prefix_lens=[6, 4],
        req_pages=[array("i", [7, 9, 11]), array("i", [3, 5])],
        page_size=4,
        sample_rows=[2, 3],
    )
    check, src, dst = scratch_batch(batch, [100, 101, 102, 103], 4, None)
    assert [list(p) for p in check.req_pages] == [[7, 100, 101], [3, 102]]
    assert (src, dst) == ([9], [100])  # A's page 9 holds its tokens 4-5: copied before the re-run
    assert check.out_cache_loc == [100 * 4 + 2, 100 * 4 + 3, 101 * 4 + 0, 102 * 4 + 0]
    assert check.sample_rows == [2, 3] and check.positions == batch.positions
