"""When things go wrong around a step: a step that raises half-way (a bug, Ctrl-C), a caller's
``on_update`` callback that raises or calls back into the engine, several threads driving one engine,
and a close racing any of them. In every case the requests in flight finish (none hangs), the reason is
said once, and the engine then serves a good request with the tokens a clean run gives."""

from __future__ import annotations

import atexit
import gc
import os
import subprocess
import sys
import threading
import time
import weakref

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from graphtop.engine.engine import Engine
from graphtop.engine.errors import EngineError
from graphtop.engine.request import FinishReason, RequestHandle
from graphtop.engine.sampling_params import SamplingParams
from graphtop.engine.telemetry import events as ev
from graphtop.engine.telemetry.bus import EventBus

pytestmark = pytest.mark.usefixtures("torch_one_thread")

LONG = SamplingParams(max_new_tokens=24, ignore_eos=True)
PROMPTS = [[5, 6, 7], [5, 6, 8], [9, 10, 11, 12]]


@pytest.fixture(scope="module")
def llama(tiny_ckpt):
    return tiny_ckpt("llama")


@pytest.fixture(scope="module")
def reference(make_engine, llama) -> list[list[int]]:
    """The tokens a clean run gives for PROMPTS (greedy)."""
    eng = make_engine(llama, graphs=False)
    try:
        return [h.token_ids for h in eng.generate(PROMPTS, LONG)]
    finally:
        eng.close()


@pytest.fixture
def engine(make_engine, llama):
    eng = make_engine(llama, graphs=False)
    yield eng
    eng.close()


def _serves_cleanly(engine: Engine, reference: list[list[int]]) -> None:
    assert [h.token_ids for h in engine.generate(PROMPTS, LONG)] == reference


def _raise_on_forward(engine: Engine, call: int, error: BaseException) -> None:
    """Make the model runner's ``call``-th forward from now raise ``error`` (once)."""
    forward = engine.model_runner.forward
    calls = [0]

    def failing(batch):
        calls[0] += 1
        if calls[0] == call:
            raise error
        return forward(batch)

    engine.model_runner.forward = failing


# --- a step that raises half-way ---------------------------------------------------------------------
@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize(
    "error, reason",
    [
        (RuntimeError("device fell over"), "RuntimeError: device fell over"),
        (KeyboardInterrupt(), "interrupted (KeyboardInterrupt) during a step"),
        (
            type("Terminated", (KeyboardInterrupt,), {})(),
            "interrupted (Terminated) during a step",
        ),  # SIGTERM: not Ctrl-C
    ],
)
def test_a_step_that_raises_fails_its_requests_and_the_engine_serves_on(
    make_engine, llama, reference, overlap, error, reason
):
    bus = EventBus()
    sub = bus.subscribe("test", maxsize=10_000)
    engine = make_engine(llama, bus=bus, graphs=False, overlap_schedule=overlap)
    try:
        # the 4th forward is a decode step; under the overlap schedule it is chained on one in flight
        _raise_on_forward(engine, 4, error)
        with pytest.raises(type(error)):
            engine.generate(PROMPTS, LONG)
        assert engine.last_error == reason
        errors = [e for e in sub.drain() if isinstance(e, ev.ErrorEvent)]
        assert [(e.message, e.where) for e in errors] == [(reason, "step")]
        assert not engine.scheduler.running and not engine.scheduler.waiting
        assert engine.pool.used_pages == 0
        _serves_cleanly(engine, reference)
    finally:
        engine.close()


def test_the_handles_of_a_failed_step_finish_with_real_tokens_only(make_engine, llama):
    engine = make_engine(llama, graphs=False)
    try:
        handles = [engine.submit(p, LONG) for p in PROMPTS]
        for _ in range(5):
            engine.step()
        _raise_on_forward(engine, 1, RuntimeError("boom"))
        with pytest.raises(RuntimeError):
            engine.run_until_done(handles)
        for h in handles:
            assert h.finish_reason is FinishReason.CANCELLED and h.error == "RuntimeError: boom"
            assert h.token_ids and all(t >= 0 for t in h.token_ids)  # no stand-in of a chained step
    finally:
        engine.close()


def test_the_background_thread_fails_the_step_and_serves_on(make_engine, llama, reference):
    engine = make_engine(llama, graphs=False)
    try:
        engine.start_background()
        _raise_on_forward(engine, 3, RuntimeError("kernel bug"))
        failed = [engine.submit(p, LONG) for p in PROMPTS]
        assert all(h.wait(30) for h in failed)
        assert {h.error for h in failed} == {"RuntimeError: kernel bug"}
        assert engine.background_running and engine.last_error == "RuntimeError: kernel bug"
        _serves_cleanly(engine, reference)
    finally:
        engine.close()


# --- on_update callbacks -----------------------------------------------------------------------------
@pytest.mark.parametrize("background", [False, True])
def test_a_callback_that_raises_is_detached_and_nothing_else_changes(engine, reference, background, caplog):
    calls = []

    def broken(handle: RequestHandle) -> None:
        calls.append(len(handle.token_ids))
        if len(handle.token_ids) >= 5:
            raise RuntimeError("UI bug")

    if background:
        engine.start_background()
    handles = [engine.submit(p, LONG) for p in PROMPTS]
    handles[0].on_update = broken
    engine.run_until_done(handles)
    assert [h.token_ids for h in handles] == reference
    assert all(h.finish_reason is FinishReason.LENGTH for h in handles)
    assert handles[0].callback_error == "RuntimeError: UI bug" and handles[0].on_update is None
    assert calls[-1] == 5  # not called again once it raised
    assert "on_update callback of request" in caplog.text


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
def test_a_callback_that_interrupts_the_failed_step_clean_up_does_not_cut_it_short(
    make_engine, llama, reference, interrupt
):
    """A Ctrl-C (or sys.exit) raised by a callback on every call: it fails the step, and again as the
    clean-up finishes that request; the other requests still finish and give their pages back."""
    bus = EventBus()
    sub = bus.subscribe("test", maxsize=10_000)
    engine = make_engine(llama, bus=bus, graphs=False)
    try:

        def interrupting(handle: RequestHandle) -> None:
            raise interrupt("from a callback")

        first = engine.submit([5, 6, 7], LONG)
        first.on_update = interrupting
        others = [engine.submit(p, LONG) for p in PROMPTS]
        with pytest.raises(interrupt, match="from a callback"):
            engine.run_until_done([first, *others])
        assert all(h.finish_reason is FinishReason.CANCELLED for h in [first, *others])
        assert not engine.scheduler.running and not engine.scheduler.waiting
        assert engine.pool.used_pages == 0
        finished = [e.request_id for e in sub.drain() if isinstance(e, ev.RequestFinished)]
        assert sorted(finished) == sorted(h.request_id for h in [first, *others])
        _serves_cleanly(engine, reference)
    finally:
        engine.close()


def test_a_callback_that_interrupts_close_does_not_cut_it_short(make_engine, llama, tmp_path):
    """close() finishes every request and releases the pool and the graphs, then the callback's
    KeyboardInterrupt goes on; a stream on a handle of the closed engine ends."""

    def interrupting(handle: RequestHandle) -> None:
        raise KeyboardInterrupt("Ctrl-C in a callback")

    engine = make_engine(llama)
    engine.serve_telemetry(runtime_dir=tmp_path)
    first = engine.submit([5, 6, 7], LONG)
    others = [engine.submit(p, LONG) for p in PROMPTS]
    for _ in range(3):
        engine.step()
    queued = engine.submit([9, 9, 9], LONG)  # a Submit command still in the queue at close
    queued.on_update = first.on_update = interrupting
    with pytest.raises(KeyboardInterrupt, match="Ctrl-C in a callback"):
        engine.close("closing")
    assert {(h.finish_reason, h.error) for h in [first, *others, queued]} == {(FinishReason.CANCELLED, "closing")}
    assert not engine.scheduler.running and not engine.scheduler.waiting and engine.commands.empty()
    assert engine.pool.k_cache == [] and engine.model_runner.decode is None and engine.telemetry.closed
    engine.close()  # a no-op now
    texts: list[str] = []
    reader = threading.Thread(target=lambda: texts.append("".join(others[0].stream())), daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive() and texts == [others[0].text]


@pytest.mark.parametrize(
    "call",
    [
        "generate",
        "wait_for_capture",
        "step",
        "run_until_done",
        "run_until_idle",
        "start_background",
        "RequestHandle.wait",
        "RequestHandle.stream",
    ],
)
@pytest.mark.parametrize("background", [False, True])
def test_waiting_on_the_engine_from_a_callback_is_refused_not_a_deadlock(engine, reference, call, background):
    # start_background() from a callback made the caller's own run_until_done fail at its next step. Only
    # the thread running the callback could finish ``other``: waiting on it there deadlocked the background
    # thread (and every close() after it). A watchdog finishes ``other`` by hand if the callback blocks, so
    # a regression fails here instead of hanging the suite.
    refused: list[str] = []
    other = engine.submit(PROMPTS[0], LONG)
    calls = {
        "generate": lambda: engine.generate([[1, 2, 3]]),
        "wait_for_capture": engine.wait_for_capture,
        "step": engine.step,
        "run_until_done": lambda: engine.run_until_done([other]),
        "run_until_idle": engine.run_until_idle,
        "start_background": engine.start_background,
        "RequestHandle.wait": other.wait,
        "RequestHandle.stream": lambda: list(other.stream()),
    }

    def callback(handle: RequestHandle) -> None:
        if handle.finished and not refused:
            try:
                calls[call]()
                refused.append("not refused")
            except EngineError as e:
                refused.append(str(e))

    if background:
        engine.start_background()
    first = engine.submit([5, 6, 7], SamplingParams(max_new_tokens=2))
    first.on_update = callback
    rest = [engine.submit(p, LONG) for p in PROMPTS[1:]]
    worker = threading.Thread(target=engine.run_until_done, args=([first, other, *rest],))
    worker.start()
    worker.join(30)
    if worker.is_alive():
        other._finish(FinishReason.CANCELLED, "the test's watchdog")
        worker.join(30)
        pytest.fail(f"{call}() from a callback blocked the engine")
    assert refused == [
        f"{call}() cannot be called from inside a step (an on_update callback runs there); "
        "submit() and cancel() can, and close() closes once the step is over"
    ]
    assert [h.token_ids for h in (other, *rest)] == reference and first.finish_reason is FinishReason.LENGTH


def test_run_until_idle_waits_for_the_background_thread_as_run_until_done_does(engine, reference):
    # it said "wait on the handles instead of calling step()", a call the caller never made
    engine.start_background()
    handles = [engine.submit(p, LONG) for p in PROMPTS]
    outcome: list[object] = []
    worker = threading.Thread(target=lambda: outcome.append(_outcome(engine.run_until_idle)))
    worker.start()
    worker.join(60)
    assert outcome == [None] and [h.token_ids for h in handles] == reference
    assert engine.background_running  # it waited: the background thread still serves
    engine.shutdown()
    late = engine.submit(PROMPTS[0], LONG)  # the thread stopped: run_until_idle steps itself
    engine.run_until_idle()
    assert late.token_ids == reference[0]


def _outcome(call) -> object:
    """None, or the exception ``call`` raised (a thread's failure, for the test's own thread to see)."""
    try:
        call()
    except Exception as e:  # noqa: BLE001 - the test compares whatever escaped
        return e
    return None


@pytest.mark.parametrize("background", [False, True])
def test_close_from_a_callback_closes_once_the_step_is_over(engine, background):
    def close_when_done(handle: RequestHandle) -> None:
        if handle.finished:
            engine.close("closed by a callback")

    if background:
        engine.start_background()
    first = engine.submit([5, 6, 7], SamplingParams(max_new_tokens=2))
    first.on_update = close_when_done
    other = engine.submit([5, 6, 8], SamplingParams(max_new_tokens=500, ignore_eos=True))
    engine.run_until_done([first, other])
    assert first.finish_reason is FinishReason.LENGTH and first.callback_error is None
    assert other.finish_reason is FinishReason.CANCELLED and other.error == "closed by a callback"
    deadline = time.monotonic() + 10
    while engine.background_running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not engine.background_running
    with pytest.raises(EngineError):
        engine.submit([1, 2, 3])


# --- several threads ---------------------------------------------------------------------------------
def test_threads_that_stream_without_the_background_thread_take_turns(engine, reference):
    handles = [engine.submit(p, LONG) for p in PROMPTS]
    texts: dict[int, str] = {}
    threads = [
        threading.Thread(target=lambda i=i: texts.__setitem__(i, "".join(handles[i].stream())))
        for i in range(len(handles))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [h.token_ids for h in handles] == reference
    assert [texts[i] for i in range(len(handles))] == [h.text for h in handles]


def test_close_from_another_thread_waits_for_the_step_in_flight(make_engine, tiny_ckpt):
    # A context of 4096 so that the requests cannot finish (2000 tokens, ~25 s here) before close();
    # with the tiny model's 256 they finished in ~3 s, and a loaded CI machine once got there first.
    engine = make_engine(tiny_ckpt("llama", max_position_embeddings=4096), graphs=False)
    outcome: dict[str, object] = {}

    def serve() -> None:
        try:
            outcome["handles"] = engine.generate(PROMPTS, SamplingParams(max_new_tokens=2000, ignore_eos=True))
        except BaseException as e:  # noqa: BLE001 - the test reports whatever escaped
            outcome["error"] = e

    worker = threading.Thread(target=serve)
    worker.start()
    while engine.loop.step_no < 3:
        time.sleep(0.001)
    engine.close("shutting down")
    worker.join(30)
    assert not worker.is_alive() and "error" not in outcome
    handles = outcome["handles"]
    assert {(h.finish_reason, h.error) for h in handles} == {(FinishReason.CANCELLED, "shutting down")}


def test_a_shutdown_that_timed_out_leaves_one_serving_thread(engine, reference):
    engine.start_background()
    engine.shutdown(timeout=0)
    engine.start_background()
    _serves_cleanly(engine, reference)
    assert sum(t.name == "graphtop-engine" for t in threading.enumerate()) == 1


# --- program exit ------------------------------------------------------------------------------------
EXIT_SCRIPT = """
import sys, time, torch
torch.set_num_threads(1)
from graphtop.engine import Engine, EngineConfig, SamplingParams
from graphtop.engine.graphs.config import GraphConfig
graphs = GraphConfig(decode_backend="disabled", prefill_backend="disabled")
engine = Engine.from_pretrained(sys.argv[1], config=EngineConfig(device="cpu", dtype="float32", graphs=graphs,
                                max_total_tokens=4096, max_running_requests=8, chunked_prefill_size=64))
engine.start_background()
h = engine.submit([5, 6, 7], SamplingParams(max_new_tokens=10_000, ignore_eos=True))
h.on_update = lambda h: h.finished and print("finished:", h.finish_reason.value, h.error, flush=True)
while len(h.token_ids) < 3:
    time.sleep(0.001)
print("exiting mid-step", flush=True)
"""


def test_a_program_that_exits_while_the_background_thread_steps_exits_cleanly(tiny_ckpt, tmp_path):
    # It aborted: "terminate called without an active exception", exit code 134 (the daemon thread
    # was cut off inside torch as Python finalized).
    script = tmp_path / "exit_mid_step.py"
    script.write_text(EXIT_SCRIPT)
    ckpt = tiny_ckpt("llama", max_position_embeddings=4096)  # 4096 tokens: it is still running at exit
    run = subprocess.run(
        [sys.executable, str(script), str(ckpt)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert "terminate called" not in run.stderr and run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.splitlines() == ["exiting mid-step", "finished: cancelled the program exited"]


def test_the_exit_hook_is_taken_back_by_close_and_keeps_no_engine_alive(make_engine, llama, monkeypatch):
    hooks: set = set()
    monkeypatch.setattr(atexit, "register", hooks.add)
    monkeypatch.setattr(atexit, "unregister", hooks.discard)
    engine = make_engine(llama, graphs=False)
    engine.start_background()
    assert len(hooks) == 1
    engine.close()
    assert hooks == set()
    other = make_engine(llama, graphs=False)
    other.start_background()
    assert not other.shutdown(timeout=0)  # only asked: the hook stays until a stop joins the thread
    other.background._thread.join(10)
    ref = weakref.ref(other)
    del other
    gc.collect()
    assert ref() is None and len(hooks) == 1
    hooks.pop()()  # the program's exit, after the engine was collected: nothing to do


# --- cancel --------------------------------------------------------------------------------------------
def test_a_finished_handle_cannot_cancel_the_request_that_reuses_its_id(engine):
    old = engine.submit([5, 6, 7], SamplingParams(max_new_tokens=2), request_id="job")
    engine.run_until_done([old])
    new = engine.submit([5, 6, 8], LONG, request_id="job")
    old.cancel()
    engine.run_until_done([new])
    assert new.finish_reason is FinishReason.LENGTH and len(new.token_ids) == LONG.max_new_tokens


def test_a_rejected_duplicate_cannot_cancel_the_live_request(engine):
    live = engine.submit([5, 6, 7], LONG, request_id="job")
    duplicate = engine.submit([5, 6, 8], LONG, request_id="job")
    duplicate.cancel()
    engine.run_until_done([live])
    assert duplicate.finish_reason is FinishReason.REJECTED
    assert live.finish_reason is FinishReason.LENGTH


def test_a_handle_cancels_its_own_request(engine):
    handle = engine.submit([5, 6, 7], LONG, request_id="job")
    engine.step()
    handle.cancel()
    engine.run_until_done([handle])
    assert handle.finish_reason is FinishReason.CANCELLED


def test_cancel_takes_a_request_id_string(engine, reference):
    handles = [engine.submit(p, LONG) for p in PROMPTS]
    with pytest.raises(TypeError, match="request_id must be a str, got list"):
        engine.cancel(["req-0"])  # type: ignore[arg-type]
    engine.run_until_done(handles)
    assert [h.token_ids for h in handles] == reference


# --- close racing waits --------------------------------------------------------------------------------
def test_wait_for_capture_on_a_closed_engine_is_an_error(engine):
    engine.close()
    with pytest.raises(EngineError, match="the engine is closed"):
        engine.wait_for_capture(timeout=1)


def test_a_close_ends_a_wait_for_capture_on_another_thread(make_engine, llama):
    engine = make_engine(llama, capture_before_serving=False)
    engine.start_background()
    for p in PROMPTS:
        engine.submit(p, SamplingParams(max_new_tokens=500, ignore_eos=True))
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            engine.wait_for_capture()
        except EngineError as e:
            outcome.append(e)

    waiter = threading.Thread(target=wait)
    waiter.start()
    engine.close()
    waiter.join(10)
    assert not waiter.is_alive()
    # either the capture finished first (no error) or the close ended the wait (an error saying so)
    assert all("closed while waiting" in str(e) for e in outcome)


# --- other misuse ----------------------------------------------------------------------------------
def test_generate_checks_every_prompt_before_serving_any(engine, reference):
    with pytest.raises(TypeError, match="got bytes"):
        engine.generate([PROMPTS[0], PROMPTS[1], b"bytes"], LONG)  # type: ignore[list-item]
    assert engine.commands.empty() and not engine.scheduler.waiting
    _serves_cleanly(engine, reference)


def test_stop_strings_need_detokenize():
    with pytest.raises(ValueError, match="stop strings need detokenize=True"):
        SamplingParams(stop=["x"], detokenize=False)


def test_one_telemetry_endpoint_per_engine(engine, tmp_path):
    server = engine.serve_telemetry(runtime_dir=tmp_path)
    with pytest.raises(EngineError, match="already serves telemetry at"):
        engine.serve_telemetry(runtime_dir=tmp_path)
    server.close()
    engine.serve_telemetry(runtime_dir=tmp_path).close()
