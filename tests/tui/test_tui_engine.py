"""The dashboard on a real tiny engine (the built-in demo model on CPU; ~5 s to load).

Exercises what the fake cannot: the real bus and subscription, capture events as the engine
emits them, streamed text from real RequestHandles, and a recapture at a step boundary.
"""

from __future__ import annotations

import threading
from typing import Iterator

import pytest
from textual.widgets import Input

from graphtop.tui.app import GraphtopApp
from graphtop.tui.screens.bucket_editor import BucketEditorScreen
from graphtop.tui.sessions.local import EngineSession
from graphtop.tui.testing import FIXED_DEVICE, screen_text, wait_until
from graphtop.tui.widgets.request_view import RequestView
from graphtop.tui.widgets.steps_table import StepsTable

engine_mod = pytest.importorskip("graphtop.engine")

pytestmark = pytest.mark.slow


def _app(session: EngineSession) -> GraphtopApp:
    return GraphtopApp(session, poll_device=False, device_sample=FIXED_DEVICE, animate=False, tick_hz=20)


@pytest.fixture
def load_gate(monkeypatch) -> Iterator[threading.Event]:
    """``Engine.from_pretrained`` waits until the test sets the event (at most 60 s): the model
    "loads" for as long as the test needs to look at the dashboard before it."""
    gate = threading.Event()
    real_load = engine_mod.Engine.from_pretrained.__func__

    def gated_load(cls, *args, **kwargs):
        gate.wait(60)
        return real_load(cls, *args, **kwargs)

    monkeypatch.setattr(engine_mod.Engine, "from_pretrained", classmethod(gated_load))
    yield gate
    gate.set()


async def test_real_engine_capture_prompt_and_recapture(load_gate) -> None:
    # Hold the load until the UI has been seen: the dashboard must be up before the model.
    gate = load_gate
    config = engine_mod.EngineConfig(device="cpu")
    session = EngineSession(None, config)
    app = _app(session)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause()
            assert "loading demo model" in screen_text(app)  # the UI is up before the model
            gate.set()
            await wait_until(pilot, lambda: app.engine_ready or app.engine_error is not None, timeout=120)
            assert app.engine_error is None
            await wait_until(pilot, lambda: app.state.ledger is not None, timeout=10)
            state = app.state
            assert state.info is not None and state.info.emulated  # CPU graphs are emulated …
            await pilot.pause(0.2)
            text = screen_text(app)
            assert "EMULATED" in text  # … and the dashboard says so
            assert "demo-qwen3" in text
            # the engine serves at once and captures between steps (flat out while idle)
            await wait_until(
                pilot,
                lambda: all(
                    p in state.capture and state.capture[p].finished is not None for p in ("decode", "prefill")
                ),
                timeout=60,
            )
            assert len(state.capture["decode"].costs) == len(session.buckets()[0])

            # a prompt streams through the real handle
            await pilot.press(*"hello graphs", "enter", "escape")
            await wait_until(pilot, lambda: app.query(RequestView) and app.query_one(RequestView).done, timeout=60)
            view = app.query_one(RequestView)
            assert view.text and view.handle.finish_reason is not None
            await wait_until(pilot, lambda: state.total_steps > 0 and state.kv is not None)
            await pilot.pause(0.2)
            table = app.query_one("#steps-table", StepsTable)
            assert table.row_count > 0

            # bucket editor → recapture → RecaptureFinished arrives and the panel says so
            await pilot.press("b")
            await pilot.pause()
            assert isinstance(app.screen, BucketEditorScreen)
            app.screen.query_one("#decode-input", Input).value = "1,2,4,8"
            await pilot.pause()
            await pilot.press("ctrl+s")
            await wait_until(pilot, lambda: state.last_recapture is not None, timeout=60)
            assert state.last_recapture.ok, state.last_recapture.message
            assert session.buckets()[0] == [1, 2, 4, 8]
            await pilot.pause(0.2)
            assert "last recapture ok" in screen_text(app)
    finally:
        session.shutdown()


async def test_prompt_typed_while_the_model_loads_is_queued_then_answered(load_gate) -> None:
    gate = load_gate
    session = EngineSession(None, engine_mod.EngineConfig(device="cpu"))
    app = _app(session)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause()
            assert "loading demo model" in screen_text(app)
            await pilot.press(*"early bird", "enter")
            await pilot.pause(0.2)
            view = app.query_one(RequestView)
            assert "queued — runs once the model is loaded" in screen_text(app) and not view.done
            gate.set()
            await wait_until(pilot, lambda: view.done, timeout=120)
            assert view.handle.error is None and view.text
            await pilot.pause(0.2)
            assert "#req-0 early bird" in screen_text(app) and "done (" in screen_text(app)
    finally:
        session.shutdown()


async def test_real_engine_bad_model_path_is_shown_not_raised(tmp_path) -> None:
    session = EngineSession(str(tmp_path / "no-such-model"), engine_mod.EngineConfig(device="cpu"))
    app = _app(session)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_until(pilot, lambda: app.engine_error is not None, timeout=60)
        await pilot.pause(0.2)
        assert "engine failed" in screen_text(app)
    session.shutdown()
