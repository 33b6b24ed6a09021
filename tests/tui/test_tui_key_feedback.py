"""A key that cannot do what it says either does the nearest useful thing or says why: "/" with the console
hidden from the palette brings it back; a view key whose view is empty says so."""

from __future__ import annotations

import pytest
from support.tui_pilot import make_app

from graphtop.tui.testing import settle


@pytest.mark.parametrize("size", [(160, 48), (80, 24)])
async def test_slash_brings_back_a_console_hidden_from_the_palette(size: tuple[int, int]) -> None:
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        app.action_toggle_panel("console")
        await pilot.pause()
        assert not app.dashboard.prompt_console.display
        await pilot.press("slash")
        await pilot.pause()
        assert app.dashboard.prompt_console.display
        assert app.focused is app.dashboard.prompt_console.query_one("#prompt")


async def test_a_view_key_with_nothing_to_show_says_why() -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert app.dashboard.compact
        app.action_toggle_panel("console")
        await pilot.press("1")  # off the prompt view first
        await pilot.pause()
        await pilot.press("4")
        await pilot.pause()
        assert any("the prompt view has nothing to show" in n.message for n in app._notifications)
        assert not app.dashboard.prompt_console.display
