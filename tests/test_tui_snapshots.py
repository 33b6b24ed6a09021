"""Snapshots of the main screen with fixed data (no clock, no blink, no device polling).

Regenerate after an intended visual change with ``pytest tests/test_tui_snapshots.py --snapshot-update``
and read the SVGs before committing them.
"""

from __future__ import annotations

from textual.widgets import Input

from graphtop.tui.testing import fixed_app, settle

SIZE = (160, 48)


def test_main_screen_dark(snap_compare) -> None:
    assert snap_compare(fixed_app("graphtop-dark"), terminal_size=SIZE, run_before=settle)


def test_main_screen_light(snap_compare) -> None:
    assert snap_compare(fixed_app("graphtop-light"), terminal_size=SIZE, run_before=settle)


def test_bucket_editor_emulated_dark(snap_compare) -> None:
    async def open_editor(pilot) -> None:
        await settle(pilot)
        await pilot.press("b")
        await pilot.pause()
        pilot.app.screen.query_one("#decode-input", Input).value = "1,2,4,8-48:8,x"
        await pilot.pause()

    assert snap_compare(fixed_app("graphtop-dark", emulated=True), terminal_size=SIZE, run_before=open_editor)
