"""Snapshots of the main screen with fixed data (no clock, no blink, no device polling), at the sizes a
terminal is likely to have, in both themes: 80x24 and 100x30 (compact: one view at a time, the prompt
view first), 120x40 (the left column beside a compact steps table) and 200x50 (everything at full
width); and at 80x24, what a newcomer meets there: the steps view, a toast, help, the bucket editor,
a replay and the Open trace dialog.

Regenerate after an intended visual change with ``pytest tests/tui/test_tui_snapshots.py --snapshot-update``
and look at the SVGs before committing them (``scripts/snapshot_png.py`` renders them to PNG).
"""

from __future__ import annotations

import os

import pytest
from textual.widgets import Input

from graphtop.tui.sessions.fake import boot_events, step_events
from graphtop.tui.sessions.replay import ReplaySession
from graphtop.tui.testing import fixed_app, leave_prompt, settle

SIZES = [(80, 24), (100, 30), (120, 40), (200, 50)]
THEMES = ["graphtop-dark", "graphtop-light"]


@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_main_screen(snap_compare, theme: str, size: tuple[int, int]) -> None:
    assert snap_compare(fixed_app(theme), terminal_size=size, run_before=settle)


def test_compact_memory_view_light(snap_compare) -> None:
    async def memory(pilot) -> None:
        await settle(pilot)
        await leave_prompt(pilot)
        await pilot.press("2")

    assert snap_compare(fixed_app("graphtop-light"), terminal_size=(80, 24), run_before=memory)


def test_export_dialog_at_80x24_dark(snap_compare) -> None:
    async def export(pilot) -> None:
        await settle(pilot)
        await pilot.app.run_action("export_trace")
        await pilot.pause()
        pilot.app.screen.query_one(Input).value = "run.jsonl"  # not the time-stamped default
        pilot.app.screen.query_one("#path-detail").update("60 events in memory · saved in /work")

    assert snap_compare(fixed_app("graphtop-dark"), terminal_size=(80, 24), run_before=export)


def test_bucket_editor_emulated_dark(snap_compare) -> None:
    async def open_editor(pilot) -> None:
        await settle(pilot)
        await leave_prompt(pilot)
        await pilot.press("b")
        await pilot.pause()
        pilot.app.screen.query_one("#decode-input", Input).value = "1,2,4,8-48:8,x"
        await pilot.pause()

    assert snap_compare(fixed_app("graphtop-dark", emulated=True), terminal_size=(160, 48), run_before=open_editor)


def test_compact_steps_view_dark(snap_compare) -> None:
    async def steps(pilot) -> None:
        await settle(pilot)
        await leave_prompt(pilot)
        await pilot.press("1")

    assert snap_compare(fixed_app("graphtop-dark"), terminal_size=(80, 24), run_before=steps)


def test_toast_above_the_prompt_at_80x24_dark(snap_compare) -> None:
    async def toast(pilot) -> None:
        await settle(pilot)
        pilot.app.notify(
            "demo model: tiny Qwen3-family model with random weights — output is gibberish by design",
            title="engine",
            severity="warning",
            timeout=60,
        )
        await pilot.pause(0.3)

    assert snap_compare(fixed_app("graphtop-dark"), terminal_size=(80, 24), run_before=toast)


def test_help_at_80x24_dark(snap_compare) -> None:
    async def help_screen(pilot) -> None:
        await settle(pilot)
        await pilot.press("f1")
        await pilot.pause()

    assert snap_compare(fixed_app("graphtop-dark"), terminal_size=(80, 24), run_before=help_screen)


def test_bucket_editor_at_80x24_dark(snap_compare) -> None:
    async def open_editor(pilot) -> None:
        await settle(pilot)
        await leave_prompt(pilot)
        await pilot.press("b")
        await pilot.pause()
        pilot.app.screen.query_one("#decode-input", Input).value = "1,2,4,8-48:8"
        await pilot.pause()

    assert snap_compare(fixed_app("graphtop-dark"), terminal_size=(80, 24), run_before=open_editor)


def test_replay_beside_the_live_engine_at_80x24_dark(snap_compare) -> None:
    async def replay(pilot) -> None:
        await settle(pilot)
        pilot.app.switch_session(ReplaySession(boot_events() + step_events(60), paused=True, label="run.jsonl"))
        pilot.app.session.seek(12)
        pilot.app.pump()
        await pilot.pause()

    assert snap_compare(fixed_app("graphtop-dark"), terminal_size=(80, 24), run_before=replay)


def test_open_trace_offers_the_traces_at_80x24_dark(snap_compare, tmp_path, monkeypatch) -> None:
    for i, name in enumerate(("run.jsonl", "graphtop-20250101-120000.jsonl")):
        (tmp_path / name).write_text("")
        os.utime(tmp_path / name, (1_700_000_000 + i, 1_700_000_000 + i))
    (tmp_path / "runs").mkdir()
    monkeypatch.chdir(tmp_path)

    async def open_trace(pilot) -> None:
        await settle(pilot)
        await pilot.app.run_action("open_trace")
        await pilot.pause()
        pilot.app.screen.query_one("#path-detail").update("a .jsonl trace written by graphtop · from /work")
        await pilot.pause()

    assert snap_compare(fixed_app("graphtop-dark"), terminal_size=(80, 24), run_before=open_trace)
