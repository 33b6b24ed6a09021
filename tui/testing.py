"""Helpers for testing the dashboard (used by tests/test_tui_*.py; importable by anyone).

Fixed-data apps for snapshots live here too, so a snapshot test and a human running
``python -m graphtop.tui.testing`` see exactly the same screen.
"""

from __future__ import annotations

import asyncio
import io
from typing import Any, Callable, Optional

from .device_probe import DeviceSample, GpuSample
from .sessions.fake import FakeSession, GiB, boot_events, step_events

FIXED_DEVICE = DeviceSample(
    gpus=(GpuSample(0, "NVIDIA H200", 118 * GiB, 141 * GiB, 87.0, 612.0, 700.0, 61.0),),
    gpu_note=None,
    cpu_pct=23.0,
    cpu_count=16,
    ram_used=41 * GiB,
    ram_total=128 * GiB,
    process_rss=3 * GiB,
)
"""A device reading for snapshots: no polling, no clock, same numbers every run."""


def fixed_app(theme: Optional[str] = None, *, emulated: bool = False, session: Any = None) -> Any:
    """The main screen with fixed scripted data, nothing time- or machine-dependent."""
    from .app import GraphtopApp

    session = session or FakeSession(boot_events(emulated=emulated) + step_events(60))
    return GraphtopApp(
        session,
        theme_name=theme,
        poll_device=False,
        device_sample=FIXED_DEVICE,
        animate=False,
        notify_events=False,
        tick_hz=None,
    )


def screen_text(app: Any) -> str:
    """The current screen as plain text (what a person would read), for assertions."""
    from rich.console import Console

    width, height = app.size
    console = Console(
        width=width,
        height=height,
        file=io.StringIO(),
        force_terminal=True,
        color_system="truecolor",
        record=True,
        legacy_windows=False,
        safe_box=False,
    )
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text(styles=False)


async def wait_until(pilot: Any, condition: Callable[[], bool], timeout: float = 5.0, step: float = 0.02) -> None:
    """Let the app run until ``condition()`` holds (workers post messages asynchronously)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await pilot.pause(step)


async def settle(pilot: Any) -> None:
    """Wait for the session to start, then pump and repaint once: a deterministic frame."""
    app = pilot.app
    await wait_until(pilot, lambda: app.engine_ready or app.engine_error is not None or app.session.kind == "replay")
    app.pump()
    await pilot.pause()


async def leave_prompt(pilot: Any) -> None:
    """Escape out of the prompt (it has the focus from the first frame with a live engine): the
    single-key shortcuts act from here on."""
    await pilot.press("escape")
    await pilot.pause()
    assert pilot.app.focused is None, pilot.app.focused


if __name__ == "__main__":  # pragma: no cover - manual look at the fixed screen
    fixed_app().run()
