"""Prompts typed before the engine is ready are held by the session and run once it is."""

from __future__ import annotations

import threading
import time

import pytest

from graphtop.tui.sessions.base import SamplingSettings
from graphtop.tui.sessions.fake import FakeHandle
from graphtop.tui.sessions.local import EngineSession
from graphtop.tui.sessions.prompt_queue import PromptQueue, QueuedHandle

GREEDY = SamplingSettings(max_new_tokens=6)


def test_held_prompts_are_sent_in_order_and_later_ones_go_straight_through() -> None:
    queue = PromptQueue()
    first = queue.submit("one", GREEDY, True)
    second = queue.submit("two", GREEDY, False)
    assert isinstance(first, QueuedHandle) and first.queued and not first.finished
    assert (first.request_id, second.request_id) == ("queued-1", "queued-2")
    assert first.new_text() == "" and first.error is None and queue.held == 2

    sent: list[tuple[str, bool]] = []

    def submit(prompt: str, settings: SamplingSettings, chat: bool) -> FakeHandle:
        sent.append((prompt, chat))
        return FakeHandle(f"req-{len(sent)}", [prompt.upper()])

    assert queue.release(submit) == 2
    assert sent == [("one", True), ("two", False)] and queue.held == 0
    assert not first.queued and first.request_id == "req-1"
    assert first.new_text() == "ONE" and first.finished and first.finish_reason == "length"
    third = queue.submit("three", GREEDY, True)
    assert isinstance(third, FakeHandle) and sent[-1] == ("three", True)


def test_a_refused_prompt_fails_alone_and_a_failed_load_fails_them_all() -> None:
    queue = PromptQueue()
    bad, good = queue.submit("bad", GREEDY, False), queue.submit("good", GREEDY, False)

    def submit(prompt: str, settings: SamplingSettings, chat: bool) -> FakeHandle:
        if prompt == "bad":
            raise ValueError("prompt is too long")
        return FakeHandle("req-1", ["ok"])

    queue.release(submit)
    assert bad.finished and bad.error == "prompt is too long" and bad.finish_reason == "rejected"
    assert good.new_text() == "ok"

    queue = PromptQueue()
    held = queue.submit("x", GREEDY, False)
    queue.fail("the engine failed to start: no such model")
    assert held.finished and held.error == "the engine failed to start: no such model" and not held.queued
    with pytest.raises(RuntimeError, match="no such model"):
        queue.submit("y", GREEDY, False)


@pytest.mark.usefixtures("torch_one_thread")
def test_prompt_typed_before_the_model_loads_runs(tiny_ckpt, make_engine) -> None:
    """EngineSession holds a prompt submitted before ``start`` and runs it once the engine is up; its
    tokens are those of the engine run directly."""
    path = tiny_ckpt("llama")
    gate = threading.Event()

    def factory(model_path, config, bus):
        gate.wait(60)
        return make_engine(model_path, bus=bus, capture_before_serving=False)

    session = EngineSession(str(path), engine_factory=factory)
    loader = threading.Thread(target=session.start)
    loader.start()
    try:
        handle = session.submit("Once upon a time", GREEDY, chat=True)  # applied at send time: a template exists
        assert handle.queued and not session.can_submit
        gate.set()
        loader.join(60)
        assert session.can_submit and not handle.queued and handle.request_id == "req-0"
        text = ""
        for _ in range(600):
            text += handle.new_text()
            if handle.finished:
                break
            time.sleep(0.05)
        assert handle.finished and handle.error is None and handle.finish_reason is not None
        assert text + handle.new_text() == handle._handle.text
        from graphtop.engine.sampling_params import SamplingParams

        direct = make_engine(path)
        want = direct.submit("Once upon a time", SamplingParams(max_new_tokens=6), chat=True)
        direct.run_until_done([want])
        assert handle._handle.token_ids == want.token_ids and handle._handle.prompt == want.prompt
    finally:
        gate.set()
        session.shutdown()
