"""The dashboard at every terminal size: what shows, what is one key away, what the hints say, and
that hidden panels give their room to the others."""

from __future__ import annotations

import pytest

from graphtop.tui.screens.dashboard import DashboardScreen
from graphtop.tui.testing import fixed_app, leave_prompt, screen_text, settle, wait_until
from graphtop.tui.widgets.steps_columns import COLUMNS, full_plan, plan_columns
from graphtop.tui.widgets.steps_table import StepsTable

SIZES = [(80, 24), (100, 30), (120, 40), (200, 50)]


def shown(app, name: str) -> bool:
    widget = app.query_one(f"#{name}")
    return widget.display and all(a.display for a in widget.ancestors_with_self if hasattr(a, "display"))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_steps_hit_rate_fallbacks_kv_and_ledger_are_visible_or_one_key_away(size) -> None:
    app = fixed_app()
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        screen: DashboardScreen = app.dashboard
        compact = size[0] < 120 or size[1] < 38
        assert screen.compact == compact
        assert app.focused is app.query_one("#prompt") and shown(app, "console")  # the first view: type at once
        if compact:
            await leave_prompt(pilot)
            await pilot.press("1")
        text = screen_text(app)
        assert "graph hits 88.3%" in text.splitlines()[0]  # labelled, on the status line at every size
        assert "eager fallbacks (7)" in text and "exceeds_max_bucket" in text
        table = app.query_one(StepsTable)
        assert shown(app, "steps") and table.plan().width <= table.scrollable_content_region.width
        # no horizontal scrolling, once the table has re-laid itself out for its width (on a loaded
        # machine that can take a frame more than ``settle`` waits)
        await wait_until(pilot, lambda: table.virtual_size.width <= table.scrollable_content_region.width)
        if not compact:
            for name in ("ledger", "kv", "capture", "device", "console"):
                assert shown(app, name), name
            assert not screen.view_bar.display
            return
        # compact: the view bar names every view, its key and the hidden ones' headline numbers
        bar = text.splitlines()[1]
        for part in (" 1 steps ", " 2 memory KV 31.7% ", " 3 capture ✓ ", " 4 prompts "):
            assert part in bar, bar
        assert not shown(app, "ledger") and not shown(app, "console")
        await pilot.press("2")
        text = screen_text(app)
        assert shown(app, "ledger") and shown(app, "kv") and not shown(app, "steps")
        assert "KV pool        ███████░░░  96.0 GiB  68.1%" in text and "used 20,800 / 65,536 tokens" in text
        assert "1 steps hit 88.3% · eager 7" in text.splitlines()[1]  # now the steps view is the hidden one
        await pilot.press("3")
        assert shown(app, "capture") and shown(app, "device") and not shown(app, "kv")
        await pilot.press("4")
        assert shown(app, "console") and not shown(app, "main")
        assert (
            app.query_one("#console").outer_size.height == size[1] - 3
        )  # all but the status, view and key lines  # the console takes the height
        await pilot.press("1")
        assert shown(app, "steps")


async def test_resizing_switches_layouts_and_keeps_the_view() -> None:
    app = fixed_app()
    async with app.run_test(size=(200, 50)) as pilot:
        await settle(pilot)
        assert not app.dashboard.compact
        await leave_prompt(pilot)
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert app.dashboard.compact and shown(app, "steps") and not shown(app, "ledger")
        await pilot.press("2")
        await pilot.resize_terminal(100, 30)
        await pilot.pause()
        assert app.dashboard.view == "memory" and shown(app, "ledger")
        await pilot.resize_terminal(160, 48)
        await pilot.pause()
        assert not app.dashboard.compact and shown(app, "steps") and shown(app, "ledger")
        await pilot.press("2")  # view keys only apply where there are views
        assert shown(app, "steps")


async def test_hidden_panels_give_their_room_to_the_others() -> None:
    app = fixed_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot)
        main = app.query_one("#main")
        app.action_toggle_panel("steps")
        await pilot.pause()
        assert app.query_one("#left").outer_size.width == main.size.width  # the column takes the width
        app.action_toggle_panel("steps")
        for name in ("capture", "ledger", "kv", "device"):
            app.action_toggle_panel(name)
        await pilot.pause()
        assert not shown(app, "left")
        assert app.query_one("#steps").outer_size.width == main.size.width  # no empty column left behind
        height = main.size.height
        app.action_toggle_panel("console")
        await pilot.pause()
        assert main.size.height > height  # and no blank console space
        for name in ("capture", "ledger", "kv", "device", "console"):
            app.action_toggle_panel(name)
        await pilot.pause()
        assert all(shown(app, n) for n in ("capture", "ledger", "kv", "device", "console", "steps"))


async def test_compact_views_skip_what_is_hidden_and_replay_has_no_prompt_view(tmp_path) -> None:
    app = fixed_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        app.action_toggle_panel("ledger")
        app.action_toggle_panel("kv")
        await pilot.pause()
        assert "memory" not in app.dashboard.available_views()
        assert "2 memory" not in screen_text(app).splitlines()[1]
        await leave_prompt(pilot)
        await pilot.press("1", "2")
        assert app.dashboard.view == "steps"
        app.action_toggle_panel("kv")  # shown again: the view that has it comes up
        await pilot.pause()
        assert app.dashboard.view == "memory" and shown(app, "kv")
        path = tmp_path / "t.jsonl"
        app._export_to(str(path))
        await pilot.pause(0.5)
        await app.open_trace(str(path)).wait()
        await pilot.pause()
        assert "prompt" not in app.dashboard.available_views()
        footer = screen_text(app).splitlines()[-1]
        assert "Prompt" not in footer and "Buckets" not in footer  # no prompt, no buckets in a replay
        await pilot.press("slash")
        assert app.focused is None


async def test_slash_in_a_compact_layout_opens_the_prompt_view() -> None:
    """From another view, "/" brings the prompt view with the focus at once: the keys typed right after
    it, in the same burst, are the prompt's (space pauses nothing)."""
    app = fixed_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await leave_prompt(pilot)
        await pilot.press("1")
        assert app.dashboard.view == "steps"
        await pilot.press("slash", *"hi there", "enter")
        await pilot.pause()
        assert app.dashboard.view == "prompt" and app.focused is app.query_one("#prompt")
        assert app.session.submitted[-1][0] == "hi there" and not app.paused


async def test_a_compact_layout_opens_on_the_prompt_and_keeps_it_while_typing() -> None:
    """The first frame of a small terminal is the prompt view with the focus in the prompt; a terminal
    that shrinks while the prompt has the focus shows the prompt view (the typing stays in sight), and a
    view chosen with the mouse takes the focus away from a prompt it hides."""
    app = fixed_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert app.dashboard.view == "prompt" and app.focused is app.query_one("#prompt")
        await pilot.resize_terminal(200, 50)
        await pilot.pause()
        await pilot.press(*"abc")
        await pilot.resize_terminal(100, 30)
        await pilot.pause()
        assert app.dashboard.view == "prompt" and shown(app, "console") and app.focused is app.query_one("#prompt")
        bar = screen_text(app).splitlines()[1]
        await pilot.click("#views", offset=(bar.index("1 steps") + 2, 0))
        await pilot.pause()
        assert app.dashboard.view == "steps" and app.focused is None
        await pilot.press("space")  # a shortcut again, not typing into a hidden prompt
        assert app.paused and app.query_one("#prompt").value == "abc"


def test_compact_column_plan_fits_and_keeps_the_telling_columns() -> None:
    widths = [len(c) for c in COLUMNS]
    widths[COLUMNS.index("fallback")] = 30
    full = full_plan(widths)
    assert plan_columns(widths, full.width) is not None and plan_columns(widths, full.width).width == full.width
    for available in (100, 90, 75, 64, 50, 40):
        plan = plan_columns(widths, available)
        titles = [c.title for c in plan.columns]
        assert plan.width <= available or available < 40, (available, plan.width)
        assert {"step", "path", "fallback"} <= set(titles)
        if plan.compact:
            assert "size" in titles and "bs" not in titles  # decode bs / prefill tokens in one column
    cells = ["7", "prefill", "1", "900", "—", "—", "eager", "prefill_tokens_over_max_bucket", "—", "22.00"]
    compact = plan_columns(widths, 60)
    row = "".join(text for text, _ in compact.render(cells))
    assert "pre 900" in row and "eager" in row and len(row) == compact.width


async def test_capture_headline_waits_for_every_planned_phase() -> None:
    """Between the decode pass and the prefill pass the engine is still capturing: no check mark yet."""
    from graphtop.engine.telemetry.events import CaptureFinished, CaptureStarted, EngineStarted
    from graphtop.tui.sessions.fake import FakeSession

    config = {
        "decode": {"backend": "full", "bs": [1, 2]},
        "prefill": {"backend": "breakable", "num_tokens": [64]},
        "available": True,
    }
    script = [
        EngineStarted(model="m", graph_config=config),
        CaptureStarted(phase="decode", buckets=(2, 1)),
        CaptureFinished(phase="decode", captured=(1, 2)),
    ]
    session = FakeSession(script)
    app = fixed_app(session=session)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        bar = screen_text(app).splitlines()[1]
        assert "3 capture capturing" in bar and "✓" not in bar
        session.publish(
            CaptureStarted(phase="prefill", buckets=(64,)), CaptureFinished(phase="prefill", captured=(64,))
        )
        app.pump()
        await pilot.pause()
        assert "3 capture ✓" in screen_text(app).splitlines()[1]


async def test_a_click_on_the_view_bar_switches_the_view() -> None:
    app = fixed_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        bar = screen_text(app).splitlines()[1]
        await pilot.click("#views", offset=(bar.index("2 memory") + 2, 0))
        await pilot.pause()
        assert app.dashboard.view == "memory" and shown(app, "ledger")
        assert app.focused is None  # the prompt the click hid has let go of the focus


async def test_the_sampling_row_fits_80_columns_chat_box_included() -> None:
    app = fixed_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert app.dashboard.view == "prompt"
        row = next(line for line in screen_text(app).splitlines() if "top-k" in line)
        assert "chat" in row and "seed" in row
