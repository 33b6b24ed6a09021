"""The dashboard's GIL diet: timer-driven renders are rate-limited per panel, yet always catch up.

The UI shares the GIL with the engine thread, so while steps stream in the panels redraw at a few
Hz (``Panel.MIN_INTERVAL``); direct pumps (tests, key actions) still render at once.
"""

from __future__ import annotations

from textual.content import Content
from textual.widgets import Static

from graphtop.tui.app import GraphtopApp
from graphtop.tui.sessions.fake import FakeSession, step_events
from graphtop.tui.testing import FIXED_DEVICE, screen_text, settle
from graphtop.tui.widgets.panel import set_content
from graphtop.tui.widgets.steps_panel import StepsPanel
from graphtop.tui.widgets.steps_table import ROWS, StepsTable

SIZE = (160, 48)


def make_app(session: FakeSession) -> GraphtopApp:
    return GraphtopApp(
        session, poll_device=False, device_sample=FIXED_DEVICE, animate=False, notify_events=False, tick_hz=None
    )


async def test_timer_renders_are_throttled_but_catch_up() -> None:
    session = FakeSession()
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        table = app.query_one(StepsTable)
        assert table.get_row_at(0)[0] == 40
        t0 = 1000.0
        session.publish(*step_events(1, start_step=50))
        app.pump(now=t0)  # a timer tick: renders at once, then not again for MIN_INTERVAL
        assert table.get_row_at(0)[0] == 50
        session.publish(*step_events(5, start_step=100))
        app.pump(now=t0 + 0.05)  # too soon after the last timer render: the table waits …
        assert table.get_row_at(0)[0] == 50
        assert app.state.total_steps == 46  # … but nothing was lost
        app.pump(now=t0 + StepsPanel.MIN_INTERVAL)  # due: the latest state shows, no new events needed
        assert table.get_row_at(0)[0] == 104
        session.publish(*step_events(1, start_step=200))
        app.pump()  # a direct pump (key action, test) is never throttled
        assert table.get_row_at(0)[0] == 200


async def test_deferred_summary_is_drawn_once_due() -> None:
    session = FakeSession()
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        t0 = 2000.0
        session.publish(*step_events(3, start_step=300))
        app.pump(now=t0)
        session.publish(*step_events(3, start_step=400))
        app.pump(now=t0 + 0.3)  # table due, summary (1 Hz) not yet
        await pilot.pause()
        assert app.query_one(StepsTable).get_row_at(0)[0] == 402
        assert "of 43 steps" in screen_text(app)
        app.pump(now=t0 + 1.2)  # no new events, yet the deferred summary is drawn
        await pilot.pause()
        assert "of 46 steps" in screen_text(app)


async def test_steps_table_keeps_rows_and_scrolls() -> None:
    session = FakeSession(script=None)
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        session.publish(*step_events(100, start_step=1000))
        app.pump()
        await pilot.pause()
        table = app.query_one(StepsTable)
        assert table.row_count == ROWS
        assert [table.get_row_at(i)[0] for i in (0, 1, ROWS - 1)] == [1099, 1098, 1099 - ROWS + 1]
        table.scroll_to(y=5, animate=False)
        await pilot.pause()
        assert table.render_line(0).text.split()[0] == "step"  # the header stays put
        assert table.render_line(1).text.split()[0] == "1094"


async def test_set_content_skips_identical_text() -> None:
    app = make_app(FakeSession())
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        static = app.query_one("#ledger-body", Static)
        first = Content.from_markup("[$success]a[/]\nb")
        set_content(static, first)
        assert not set_content(static, Content.from_markup("[$success]a[/]\nb"))
        assert set_content(static, Content.from_markup("[$warning]a[/]\nb"))  # same text, new style


async def test_tick_slows_down_while_the_engine_is_busy() -> None:
    session = FakeSession()
    app = GraphtopApp(
        session, poll_device=False, device_sample=FIXED_DEVICE, animate=False, notify_events=False, tick_hz=15
    )
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app._tick()  # nothing queued: the idle rate (a timer tick may have drained the boot burst)
        assert app._tick_rate == 15
        session.publish(*step_events(200, start_step=1000))  # far above BUSY_EVENTS_PER_S
        app._tick()
        assert app._tick_rate == app.busy_hz
        app._tick()  # the engine went quiet: back to the snappy rate
        assert app._tick_rate == 15
        assert app.state.total_steps == 240
