"""The palette's parity toggle on a real (tiny, CPU) engine: checks switch on at a step boundary, run
against the emulated graphs, and the panel shows them."""

from __future__ import annotations

import pytest

from graphtop.tui.app import GraphtopApp
from graphtop.tui.sessions.local import EngineSession
from graphtop.tui.testing import FIXED_DEVICE, screen_text, wait_until

engine_mod = pytest.importorskip("graphtop.engine")

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("torch_one_thread")]


async def test_palette_toggle_runs_checks_on_the_live_engine(tiny_ckpt) -> None:
    from graphtop.engine.graphs.config import build_graph_config

    path = tiny_ckpt("qwen3")

    def factory(_model, config, bus):
        return engine_mod.Engine.from_pretrained(path, config=config, bus=bus)

    config = engine_mod.EngineConfig(
        device="cpu",
        max_total_tokens=4096,
        max_running_requests=4,
        chunked_prefill_size=64,
        graphs=build_graph_config(None, {"decode.bs": [1, 2, 4]}),
    )
    session = EngineSession("tiny", config, engine_factory=factory)
    app = GraphtopApp(session, poll_device=False, device_sample=FIXED_DEVICE, animate=False, tick_hz=20)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_until(pilot, lambda: app.engine_ready, timeout=120)
            assert session.parity_every == 0
            app.action_toggle_parity()
            await wait_until(pilot, lambda: session.parity_every == app.PARITY_EVERY, timeout=10)
            await pilot.press(*"parity", "enter", "escape")  # 128 new tokens: 64+ graph steps
            await wait_until(pilot, lambda: app.state.parity.checks > 0, timeout=120)
            await pilot.pause(0.6)
            text = screen_text(app)
            assert "graph parity" in text and "1 in 64 ·" in text and "all agree" in text
            assert not app.state.parity.failing
    finally:
        session.shutdown()
