"""Nothing draws into widgets the app is removing: while a shutdown prunes the screen (as a test's exit
does, without ``App.exit``), every path a timer tick, a toast's timer or a worker's message can take (the
pump, each panel, the status line's badges, the replay bar, the device panel, the prompt console, the
screen's reflow) returns quietly instead of raising NoMatches for a child already gone."""

from __future__ import annotations

import asyncio

from support.tui_pilot import make_app, pump

from graphtop.tui.testing import FIXED_DEVICE


def _draw_everything(app) -> None:
    dashboard = app.dashboard
    app.pump()
    app.render_all(force=True)
    app.render_status(force=True)
    for panel in dashboard.panels:
        panel.update_view(app.state, force=True)
    dashboard.status_line.update_view(app.state, mode="PAUSED", dropped=3, force=True)
    dashboard.status_line._fit()
    dashboard.device_panel.show(FIXED_DEVICE)
    dashboard.reflow()
    app.prompt_console.set_chat_available(True)
    app.prompt_console.poll()


async def test_draws_during_a_shutdown_are_skipped_not_raised() -> None:
    app = make_app()
    failures: list[BaseException] = []
    async with app.run_test(size=(160, 48)) as pilot:
        await pump(pilot, 3)
        _draw_everything(app)  # all of it works while the app runs
        shutdown = asyncio.ensure_future(app._shutdown())
        for _ in range(10_000):  # bounded: the shutdown takes a few loop turns
            if shutdown.done():
                break
            try:
                _draw_everything(app)
            except Exception as exc:  # noqa: BLE001 - the failure this test is about
                failures.append(exc)
                break
            await asyncio.sleep(0)
        await shutdown
        assert not failures, failures
        _draw_everything(app)  # and after it
