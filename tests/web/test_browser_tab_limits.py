"""A browser tab's dashboard holds prompts to the API's limits and touches no files of its host.

The session attaches to a real telemetry endpoint on a scripted bus (no model): the engine's queue is
what the kv_pool events the endpoint forwards say, as it is for the dashboard."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.tui_pilot import make_app

from graphtop.engine.telemetry.bus import EventBus
from graphtop.engine.telemetry.events import KVPoolState
from graphtop.engine.telemetry.server import EndpointConfig, TelemetryServer
from graphtop.server.protocol import MAX_TEMPERATURE
from graphtop.tui.sessions.base import SamplingSettings
from graphtop.tui.sessions.browser_tab import BrowserTabSession, PromptLimits
from graphtop.tui.testing import settle


@pytest.fixture
def endpoint(tmp_path: Path):
    bus = EventBus()
    server = TelemetryServer(bus, EndpointConfig(runtime_dir=tmp_path / "rt", label="scripted"))
    yield bus, server
    server.close()


def _seen_queue(session: BrowserTabSession, in_flight: int, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while session._in_flight is None or session._in_flight[0] != in_flight:
        assert time.monotonic() < end, "the kv_pool event did not arrive"
        session.drain()
        time.sleep(0.02)


def test_a_tab_refuses_what_the_api_refuses(endpoint) -> None:
    bus, server = endpoint
    limits = PromptLimits(max_queued=2, max_temperature=MAX_TEMPERATURE)
    session = BrowserTabSession(server.endpoint, server.token, label="tab", limits=limits)
    session.connect()
    try:
        calm = SamplingSettings()
        assert session.refusal(calm) is None  # nothing known about the queue yet: the API would admit it
        hot = SamplingSettings(temperature=2.5)
        assert session.refusal(hot) == "temperature 2.5 is over 2, the most the API takes"
        with pytest.raises(ValueError, match="over 2"):
            session.submit("hi", hot, chat=False)

        bus.publish(KVPoolState(capacity_tokens=100, running=4, queued=1, max_running=4))
        _seen_queue(session, 5)
        assert session.refusal(calm) is None  # 5 of 4 running + 2 queued
        bus.publish(KVPoolState(capacity_tokens=100, running=4, queued=2, max_running=4))
        _seen_queue(session, 6)
        said = session.refusal(calm)
        assert said == "the engine holds 6 requests, the API's limit (4 running + 2 queued): retry later"
        with pytest.raises(ValueError, match="retry later"):
            session.submit("hi", calm, chat=False)
    finally:
        session.shutdown()


async def test_a_tab_neither_reads_nor_writes_host_files(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    app = make_app()
    app.host_files = False
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        first = app.screen
        for action in ("export_trace", "open_trace", "screenshot_prompt"):
            await pilot.app.run_action(action)
            await pilot.pause()
            assert app.screen is first, action  # no path dialog opened
        said = [n.message for n in app._notifications]
        assert len(said) == 3 and all("does not read or write files" in m for m in said)
    assert list(tmp_path.iterdir()) == []
