"""The sampling row's fields take numbers as they are typed or pasted, and a rejected keystroke costs
nothing: Textual's own integer/number patterns backtracked exponentially (24 digits then a letter froze
the dashboard for seconds), so the row uses linear patterns of its own, ASCII digits only."""

from __future__ import annotations

import re
import time

import pytest
from support.tui_pilot import make_app
from textual import events
from textual.widgets import Input

from graphtop.tui.testing import settle
from graphtop.tui.widgets.sampling_row import FIELDS, INTEGER_RESTRICT, MAX_LENGTH, NUMBER_RESTRICT, RESTRICTS

SIZE = (120, 40)


@pytest.mark.parametrize(
    "pattern, accepted, rejected",
    [
        (
            INTEGER_RESTRICT,
            ["", "-", "+", "0", "-12", "+7", "123456"],
            ["a", "1a", "1.5", "1e3", "1_000", "1 ", "--1", "١٢", "１２"],
        ),
        (
            NUMBER_RESTRICT,
            ["", "-", ".", "0", "0.7", "-.5", "1.", "1e", "1e-", "1.5E+3", "+2e10"],
            ["a", "e5", ".e5", "1..2", "1e5e", "1_000", "1 ", "inf", "nan", "١٫٢", "0.７"],
        ),
    ],
)
def test_patterns_take_partial_numbers_and_only_ascii_digits(
    pattern: str, accepted: list[str], rejected: list[str]
) -> None:
    assert [t for t in accepted if re.fullmatch(pattern, t) is None] == []
    assert [t for t in rejected if re.fullmatch(pattern, t) is not None] == []


@pytest.mark.parametrize("pattern", [INTEGER_RESTRICT, NUMBER_RESTRICT])
def test_a_rejected_value_is_refused_in_linear_time(pattern: str) -> None:
    """Far past the fields' length: linear is milliseconds; quadratic or worse would not finish."""
    for text in ("1" * 100_000 + "a", "1" * 50_000 + "." + "1" * 50_000 + "e" + "1" * 50_000 + " "):
        start = time.perf_counter()
        assert re.fullmatch(pattern, text) is None
        assert time.perf_counter() - start < 1.0


async def test_a_letter_after_many_digits_or_a_forty_digit_paste_is_refused_at_once() -> None:
    """31 digits then a typed letter is the old worst case (2**31 backtracking steps for an integer
    field); the cap on length is checked before the pattern, so the field sits one under it."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        for fid, _label, _default, kind, _tip in FIELDS:
            field = app.query_one(f"#{fid}", Input)
            assert field.type == "text" and field.restrict == RESTRICTS[kind]  # not Textual's patterns
            field.focus()
            await pilot.pause()  # focus selects the value: set it after, so typing appends
            digits = "1" * (MAX_LENGTH - 1)
            field.value = digits
            field.cursor_position = len(digits)
            await pilot.pause()
            start = time.perf_counter()
            await pilot.press("a", "space", "1", "1")
            assert time.perf_counter() - start < 5  # was hours for the integer fields
            assert field.value == digits + "1"  # letter and space refused, then digits up to the cap
            field.value = "7"
            field.cursor_position = 1
            for paste in ("1" * 40 + "a", "1" * 40, "1" * 30 + " ", "١٢"):  # a paste is refused whole
                field.post_message(events.Paste(paste))
                await pilot.pause()
                assert field.value == "7", (fid, paste)
            field.post_message(events.Paste("12"))
            await pilot.pause()
            assert field.value == "712"
        assert app._exception is None


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("temperature", "nan", "temperature must be a finite number"),
        ("temperature", "1e309", "temperature must be a finite number"),
        ("seed", "-1", "seed must be an integer >= 0"),
        ("seed", str(2**64), "seed must be at most"),
        ("max-tokens", "1" + "0" * 30, "max tokens must be at most"),
        ("top-p", "0", "top-p must be in (0, 1]"),
        # a value that is no number names its field (Python's own words, "invalid literal for int() with
        # base 10: ''", named none)
        ("max-tokens", "", "max tokens is empty: enter an integer"),
        ("max-tokens", "-", "max tokens: '-' is not an integer"),
        ("temperature", "1e", "temperature: '1e' is not a number"),
        ("top-p", ".", "top-p: '.' is not a number"),
        ("top-k", "+", "top-k: '+' is not an integer"),
        ("seed", "-", "seed: '-' is not an integer"),
    ],
)
async def test_settings_the_engine_refuses_are_refused_as_typed(field: str, value: str, says: str) -> None:
    """One home for the rules (the engine's SamplingParams): a prompt typed while the model loads is
    not queued with settings the engine would refuse later."""
    from graphtop.tui.widgets.sampling_row import SamplingRow

    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot)
        row = app.query_one(SamplingRow)
        row.query_one(f"#{field}", Input).value = value
        with pytest.raises(ValueError, match=re.escape(says)):
            row.settings()


async def test_empty_optional_fields_read_as_their_defaults() -> None:
    from graphtop.tui.widgets.sampling_row import SamplingRow

    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot)
        row = app.query_one(SamplingRow)
        for field in ("temperature", "top-p", "top-k", "seed"):
            row.query_one(f"#{field}", Input).value = ""
        row.query_one("#max-tokens", Input).value = "8"
        got = row.settings()
        assert (got.max_new_tokens, got.temperature, got.top_p, got.top_k, got.seed) == (8, 0.0, 1.0, 0, None)
