"""Driving the dashboard under Pilot: an app fed by a scripted FakeSession, frames pumped by hand."""

from __future__ import annotations

from graphtop.tui.app import GraphtopApp
from graphtop.tui.screens.path_prompt import PathPromptScreen
from graphtop.tui.sessions.fake import FakeSession
from graphtop.tui.testing import FIXED_DEVICE


def make_app(session: FakeSession | None = None, **kw) -> GraphtopApp:
    kw.setdefault("poll_device", False)
    kw.setdefault("device_sample", FIXED_DEVICE)
    kw.setdefault("animate", False)
    kw.setdefault("tick_hz", None)  # the test pumps: every frame is deterministic
    return GraphtopApp(session or FakeSession(), **kw)


async def pump(pilot, times: int = 1) -> None:
    for _ in range(times):
        pilot.app.pump()
        await pilot.pause()


async def open_path_prompt(pilot, action: str) -> PathPromptScreen:
    await pilot.app.run_action(action)
    await pilot.pause()
    screen = pilot.app.screen
    assert isinstance(screen, PathPromptScreen)
    return screen
