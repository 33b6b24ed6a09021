"""Bucket lists as people paste them: a number of thousands of digits or in another script's digits is
a one-line BucketSpecError (what the CLI and the editor catch), never int()'s own ValueError, and the
bucket editor shows it inline with ✗ instead of crashing."""

from __future__ import annotations

import pytest
from support.tui_pilot import make_app
from textual import events
from textual.widgets import Button, Input, Label

from graphtop.engine.graphs.bucket_list import MAX_DIGITS, MAX_VALUE, BucketList, BucketSpecError
from graphtop.tui.screens.bucket_editor import BucketEditorScreen
from graphtop.tui.testing import settle

SIZE = (120, 40)
HUGE = "9" * 5000
OVER = "9" * 4301  # one past int()'s 4,300-digit limit


@pytest.mark.parametrize(
    "text, message",
    [
        (HUGE, "a 5,000-digit number, over the largest a list takes (999,999,999,999,999,999)"),
        ("1-" + OVER, "a 4,301-digit number"),
        ("1-64:" + OVER, "a 4,301-digit number"),
        (OVER + "-" + OVER, "a 4,301-digit number"),
        ("1," + "1" * (MAX_DIGITS + 1), f"a {MAX_DIGITS + 1}-digit number"),
        ("1-" + "9" * MAX_DIGITS, "expands to 999,999,999,999,999,999 buckets, over the limit of 512"),
        ("١٢", "'١٢': write numbers with the digits 0-9"),
        ("1,2,１２8", "'１２8': write numbers with the digits 0-9"),
        ("1-٨", "write numbers with the digits 0-9"),
    ],
    ids=[
        "5000-digits",
        "range-end",
        "step",
        "both-ends",
        "19-digits",
        "18-digit-range",
        "arabic-indic",
        "fullwidth",
        "range-arabic-indic",
    ],
)
def test_huge_and_non_ascii_numbers_are_one_line_errors(text: str, message: str) -> None:
    with pytest.raises(BucketSpecError) as err:
        BucketList.parse(text).as_list()
    shown = str(err.value)
    assert message in shown
    assert "\n" not in shown and len(shown) < 160  # fit to show inline, however long the paste
    assert err.value.token is not None and err.value.token in text


def test_numbers_up_to_the_cap_still_parse() -> None:
    assert BucketList.parse(f"1,{MAX_VALUE}").as_list() == [1, MAX_VALUE]
    assert BucketList.parse("0" * 5000 + "8").as_list() == [8]  # leading zeros are not digits of the value
    assert BucketList.parse("1-64:" + "9" * MAX_DIGITS).as_list() == [1]  # a step past the range: just its start
    with pytest.raises(BucketSpecError, match=r"is over max running \(64\)"):
        BucketList.parse(str(MAX_VALUE), maximum=64, maximum_label="max running").as_list()


def test_negative_huge_number_says_buckets_must_be_positive() -> None:
    with pytest.raises(BucketSpecError, match="buckets must be ≥ 1"):
        BucketList.parse("-" + HUGE).as_list()


@pytest.mark.parametrize(
    "text, message",
    [
        (HUGE, "5,000-digit number"),
        ("1-" + OVER, "4,301-digit number"),
        ("1-64:" + OVER, "4,301-digit number"),
        ("١٢", "digits 0-9"),
    ],
    ids=["5000-digits", "range-end", "step", "arabic-indic"],
)
async def test_bucket_editor_shows_the_error_inline_and_does_not_crash(text: str, message: str) -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("escape", "b")  # the prompt has the focus from the first frame
        editor = app.screen
        assert isinstance(editor, BucketEditorScreen)
        await pilot.press("ctrl+u")
        editor.query_one("#decode-input", Input).post_message(events.Paste(text))
        await pilot.pause()
        msg = str(editor.query_one("#decode-msg", Label).render())
        assert msg.startswith("✗") and message in msg and len(msg) < 160
        assert editor.query_one("#confirm", Button).disabled  # nothing half-typed can recapture
        await pilot.press("ctrl+u", *"1,2")
        assert str(editor.query_one("#decode-msg", Label).render()).startswith("✓")
        assert app.screen is editor and app._exception is None


async def test_bucket_editor_refuses_a_bucket_over_the_static_buffers_inline() -> None:
    """The engine refuses a recapture past its static buffers; the editor accepted it, closed, and the
    typed list was lost to a toast. Now ✗ inline, with the engine's words, and Recapture stays off."""
    from graphtop.engine.graphs.bucket_list import STATIC_BUFFERS_MAXIMUM

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        editor = BucketEditorScreen(
            [1, 2, 4], [16, 32], max_running=8, kv_capacity=4096, max_buckets={"decode": 4, "prefill": 64}
        )
        await app.push_screen(editor)
        await pilot.pause()
        editor.query_one("#decode-input", Input).value = "1,2,4,8"
        await pilot.pause()
        msg = str(editor.query_one("#decode-msg", Label).render())
        assert msg.startswith("✗") and f"bucket 8 is over {STATIC_BUFFERS_MAXIMUM} (4)" in msg
        assert editor.query_one("#confirm", Button).disabled
        await pilot.press("ctrl+s")
        assert app.screen is editor  # still open, the typed list kept
        editor.query_one("#decode-input", Input).value = "1,2,4"
        editor.query_one("#prefill-input", Input).value = "16-128:16"
        await pilot.pause()
        assert "over the static buffers' maximum (64)" in str(editor.query_one("#prefill-msg", Label).render())
        editor.query_one("#prefill-input", Input).value = "16-64:16"
        await pilot.pause()
        assert not editor.query_one("#confirm", Button).disabled
