"""The dashboard attached over the telemetry endpoint to a real tiny engine on CPU (Pilot).

The engine runs in this process (its endpoint and thread), the dashboard drives a RemoteSession
exactly as ``graphtop attach`` does: capture state from the snapshot, a prompt streamed back over the
socket, a recapture through the bucket editor, ``q`` detaching while the engine keeps serving.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Input

from graphtop.engine.telemetry import protocol as p
from graphtop.engine.telemetry.bus import EventBus
from graphtop.engine.telemetry.server import EndpointConfig, TelemetryServer
from graphtop.tui.app import GraphtopApp
from graphtop.tui.screens.bucket_editor import BucketEditorScreen
from graphtop.tui.sessions.fake import boot_events
from graphtop.tui.sessions.remote import RemoteSession
from graphtop.tui.testing import FIXED_DEVICE, screen_text, wait_until
from graphtop.tui.widgets.request_view import RequestView

pytestmark = pytest.mark.slow


def _app(session: RemoteSession, **kwargs: Any) -> GraphtopApp:
    return GraphtopApp(session, poll_device=False, device_sample=FIXED_DEVICE, animate=False, tick_hz=20, **kwargs)


def _attach_to_tiny_engine(
    tiny_ckpt, make_engine, tmp_path: Path
) -> tuple[Any, TelemetryServer, RemoteSession, GraphtopApp]:
    """A tiny engine serving in the background with an endpoint, and a dashboard attached to it."""
    engine = make_engine(tiny_ckpt("qwen3"))
    server = engine.serve_telemetry(runtime_dir=tmp_path / "rt")
    engine.start_background()
    session = RemoteSession(server.endpoint, server.token, label="tiny")
    session.connect()
    return engine, server, session, _app(session)


def _footer(app: GraphtopApp) -> str:
    return screen_text(app).rstrip().splitlines()[-1]


async def test_dashboard_attached_to_a_real_engine(tiny_ckpt, make_engine, tmp_path: Path, torch_one_thread) -> None:
    engine, server, session, app = _attach_to_tiny_engine(tiny_ckpt, make_engine, tmp_path)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_until(pilot, lambda: app.engine_ready or app.engine_error is not None, timeout=60)
            assert app.engine_error is None
            state = app.state
            await wait_until(pilot, lambda: state.ledger is not None and state.info is not None, timeout=10)
            assert state.info.emulated and state.capture["decode"].finished is not None
            assert state.current_buckets("decode") == engine.decode_buckets  # from the snapshot alone
            await pilot.pause(0.2)
            text = screen_text(app)
            assert "EMULATED" in text and "^q Detach" in _footer(app) and "Quit" not in _footer(app)

            # a prompt streams back over the endpoint into the console
            await pilot.press(*"hello graphs", "enter", "escape")
            await wait_until(pilot, lambda: app.query(RequestView) and app.query_one(RequestView).done, timeout=60)
            view = app.query_one(RequestView)
            assert view.text and view.handle.finish_reason == "length" and view.handle.error is None
            await wait_until(pilot, lambda: state.total_steps > 0 and state.kv is not None)

            # bucket editor → recapture on the engine → RecaptureFinished comes back
            await pilot.press("b")
            await pilot.pause()
            assert isinstance(app.screen, BucketEditorScreen)
            app.screen.query_one("#decode-input", Input).value = "1,2,4"
            await pilot.pause()
            await pilot.press("ctrl+s")
            await wait_until(pilot, lambda: state.last_recapture is not None, timeout=60)
            assert state.last_recapture.ok, state.last_recapture.message
            assert engine.decode_buckets == [1, 2, 4]
            await wait_until(pilot, lambda: state.current_buckets("decode") == [1, 2, 4])

            # q detaches: the app exits, the engine keeps serving, the endpoint forgets the viewer
            await pilot.press("q")
            await pilot.pause(0.2)
        assert app.return_code == 0
        session.shutdown()
        await_viewers_gone(server)
        assert engine.background_running
        assert engine.generate(["still here"])[0].finish_reason is not None
    finally:
        session.shutdown()
        engine.close()


def await_viewers_gone(server: TelemetryServer, timeout: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while server.viewers and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not server.viewers


async def test_engine_failing_to_load_is_shown(tmp_path: Path) -> None:
    bus = EventBus()
    server = TelemetryServer(bus, EndpointConfig(runtime_dir=tmp_path / "rt", label="broken"))
    session = RemoteSession(server.endpoint, server.token, label="broken")
    session.connect()
    app = _app(session)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause(0.2)
            assert "loading broken" in screen_text(app)
            server.engine_failed("CheckpointError: no config.json in /nowhere")
            await wait_until(pilot, lambda: app.engine_error is not None, timeout=10)
            await pilot.pause(0.2)
            assert "engine failed" in screen_text(app)
            assert "no config.json" in app.engine_error
    finally:
        session.shutdown()
        server.close()


async def test_dropped_events_are_shown_and_engine_end_is_said(tmp_path: Path) -> None:
    bus = EventBus()
    server = TelemetryServer(bus, EndpointConfig(runtime_dir=tmp_path / "rt"))
    for ev in boot_events():
        bus.publish(ev)
    session = RemoteSession(server.endpoint, server.token)
    session.connect()
    app = _app(session)
    try:
        async with app.run_test(size=(250, 48)) as pilot:  # wide: the drop count ends the status line
            await wait_until(pilot, lambda: app.state.info is not None, timeout=10)
            # the endpoint skips 7 events for this viewer: the status line says so
            session._handle(p.server_decoder.decode(p.encoder.encode(p.Events(session.stream.expected_seq + 7, 0, []))))
            await pilot.pause(0.3)
            assert "dropped events 7" in screen_text(app)
            server.close("the run finished")
            await wait_until(pilot, lambda: session.ended is not None, timeout=10)
            await pilot.pause(0.3)
            assert app.is_running  # an attached viewer stays to show the final state
    finally:
        session.shutdown()
        server.close()


async def test_owned_viewer_exits_when_its_engine_process_ends(tmp_path: Path) -> None:
    server = TelemetryServer(EventBus(), EndpointConfig(runtime_dir=tmp_path / "rt"))
    session = RemoteSession(server.endpoint, server.token)
    session.connect()
    app = _app(session, exit_when_engine_ends=True)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            server.close("graphtop is quitting")
            await wait_until(pilot, lambda: not app.is_running, timeout=10)
        assert app.return_code == 1
    finally:
        session.shutdown()


async def test_parity_toggle_reaches_the_engine_over_the_endpoint(
    tiny_ckpt, make_engine, tmp_path: Path, torch_one_thread
) -> None:
    """The palette's parity toggle in an attached dashboard switches the engine's checks on and off;
    the checks' events come back and fill the parity panel."""
    engine, server, session, app = _attach_to_tiny_engine(tiny_ckpt, make_engine, tmp_path)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_until(pilot, lambda: app.engine_ready or app.engine_error is not None, timeout=60)
            assert app.engine_error is None and session.parity_every == 0
            app.action_toggle_parity()
            assert session.parity_every == app.PARITY_EVERY
            await wait_until(pilot, lambda: engine.parity_every == app.PARITY_EVERY, timeout=30)
            session.set_parity_every(1)  # every graph step, so a short prompt is checked
            await wait_until(pilot, lambda: engine.parity_every == 1, timeout=30)
            await pilot.press(*"check me", "enter", "escape")
            await wait_until(pilot, lambda: app.state.parity.checks > 0, timeout=60)
            assert app.state.parity.mismatches == 0
            app.action_toggle_parity()
            await wait_until(pilot, lambda: engine.parity_every == 0, timeout=30)
            await pilot.press("q")
            await pilot.pause(0.2)
    finally:
        session.shutdown()
        server.close()
        engine.close()
