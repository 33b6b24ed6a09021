"""Text from outside the UI is drawn as it is: never as markup, never as terminal controls; dialogs that
write never replace a file on one keystroke, and typed text that names no file is a message, not a crash."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from support.tui_pilot import make_app, pump
from support.tui_pilot import open_path_prompt as _open
from textual.content import Content
from textual.widgets import Input, Static

from graphtop.engine.telemetry.events import ErrorEvent
from graphtop.tui.file_actions import PathTextError, path_from_text
from graphtop.tui.safe_text import literal, printable, safe_content
from graphtop.tui.screens.path_prompt import PathPromptScreen
from graphtop.tui.sessions.fake import FakeSession
from graphtop.tui.testing import leave_prompt, settle, wait_until
from graphtop.tui.widgets.request_view import RequestView

SIZE = (120, 40)


def toasts(app) -> list[tuple[str, str]]:
    return [(n.title, n.message) for n in app._notifications]


# ---------------------------------------------------------------- safe_text
def test_printable_shows_controls_as_stand_ins_one_for_one() -> None:
    raw = "a\x1b]0;title\x07b\x00c\x9bd\x7fe\ud800f\tg\nh\ri"
    safe = printable(raw)
    assert len(safe) == len(raw)
    assert safe == "a\u241b]0;title\u2407b\u2400c\ufffdd\u2421e\ufffdf\tg\nh\u240di"
    plain = "plain text, [markup] and ✓ stay"
    assert printable(plain) is plain


BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


def test_bidi_controls_are_stand_ins_too() -> None:
    """A right-to-left override showed ``evil\u202etxt.exe`` as ``evilexe.txt``: every bidi control is a
    stand-in now, one for one, in every report (they share ``printable``), and dropped from a field."""
    from graphtop.tui.safe_text import error_line, field_text, one_line

    for raw in (f"a{c}b" for c in BIDI):
        assert printable(raw) == "a\ufffdb" and one_line(raw) == "a\ufffdb" and field_text(raw) == "ab", ascii(raw)
    assert error_line("no model evil\u202etxt.exe") == "graphtop: error: no model evil\ufffdtxt.exe"
    arabic = "\u0645\u0631\u062d\u0628\u0627 \u05e9\u05dc\u05d5\u05dd"  # right-to-left letters are text
    assert printable(arabic) is arabic


def test_safe_content_keeps_the_style_spans() -> None:
    styled = Content.from_markup("[b]$x[/b] tail", x="\x1b[31mred")
    safe = safe_content(styled)
    assert safe.plain == "\u241b[31mred tail"
    assert list(safe.spans) == list(styled.spans)
    assert literal("[/] [@click=app.quit]x[/]").plain == "[/] [@click=app.quit]x[/]"


@pytest.mark.parametrize(
    "text, says",
    [
        ("a\x00b", "NUL"),
        ("\ud800x", "characters no file name can hold"),
        ("~no-such-user-graphtop/x", "no such user"),
    ],
)
def test_path_text_that_names_no_file_is_one_line(text: str, says: str) -> None:
    with pytest.raises(PathTextError, match=says):
        path_from_text(text)


# ---------------------------------------------------------------- toasts
async def test_engine_errors_and_logs_with_markup_show_literally_and_do_not_crash() -> None:
    session = FakeSession()
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        session.publish(
            ErrorEvent(where="[b]decode[/]", message="bad token [/INST] after \x1b[31m", fatal=False, ts=1.0)
        )
        session.logs.append((logging.WARNING, "[@click=app.quit]click me[/]"))
        await pump(pilot, 2)
        shown = toasts(app)
        assert ("engine error in [b]decode[/]", "bad token [/INST] after \u241b[31m") in shown
        assert ("engine", "[@click=app.quit]click me[/]") in shown
        assert all(n.markup is False for n in app._notifications)
        assert app.is_running


async def test_a_typed_path_with_markup_is_said_literally(tmp_path: Path) -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app._export_to(str(tmp_path / "no-such-folder" / "[/]" / "x.jsonl"))
        await wait_until(pilot, lambda: any(t == "export failed" for t, _ in toasts(app)))
        assert any("[/]" in m for t, m in toasts(app) if t == "export failed")
        assert app.is_running


async def test_a_completion_with_terminal_controls_is_drawn_with_stand_ins() -> None:
    app = make_app(FakeSession(reply="\x1b]0;PWNED\x07 \x1b[5;31mBLINK"))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press(*"\x1b[1mhi", "enter")  # the prompt has the focus from the start
        await wait_until(pilot, lambda: bool(app.query(RequestView)))
        view = app.query_one(RequestView)
        await wait_until(pilot, lambda: (view.poll() or True) and view.done)
        shown = view.visual.plain if hasattr(view, "visual") else str(view.render())
        assert "\x1b" not in shown and "\x07" not in shown
        assert "\u241b]0;PWNED\u2407 \u241b[5;31mBLINK" in shown


# ---------------------------------------------------------------- dialogs that write
def _message(dialog: PathPromptScreen) -> str:
    widget = dialog.query_one("#path-message", Static)
    return str(widget.render()) if widget.display else ""


@pytest.mark.parametrize("action, name", [("export_trace", "notes.jsonl"), ("screenshot_prompt", "notes.svg")])
async def test_an_existing_file_is_replaced_only_on_a_second_enter(tmp_path: Path, action: str, name: str) -> None:
    target = tmp_path / name
    target.write_text("my precious data\n")
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        dialog = await _open(pilot, action)
        dialog.query_one(Input).value = str(target)
        await pilot.press("enter")
        assert app.screen is dialog  # still asking
        assert "exists: enter again replaces it" in _message(dialog)
        assert target.read_text() == "my precious data\n"
        await pilot.press("enter")
        assert app.screen is not dialog
        await wait_until(pilot, lambda: target.read_text() != "my precious data\n")
        assert target.read_text().startswith("<svg" if name.endswith(".svg") else '{"')
        assert [p.name for p in tmp_path.iterdir()] == [name]  # no temporary file left beside it


async def test_changing_the_text_after_the_warning_asks_again(tmp_path: Path) -> None:
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text("A\n")
    second.write_text("B\n")
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        dialog = await _open(pilot, "export_trace")
        field = dialog.query_one(Input)
        field.value = str(first)
        await pilot.press("enter")
        field.value = str(second)
        await pilot.press("enter")
        assert app.screen is dialog and str(second) in _message(dialog)
        await pilot.press("escape")
        assert first.read_text() == "A\n" and second.read_text() == "B\n"


@pytest.mark.parametrize("action", ["export_trace", "screenshot_prompt"])
@pytest.mark.parametrize("text, says", [("~no-such-user-graphtop/x", "no such user")])  # a NUL or lone
# surrogate never gets into the field (CleanInput drops it: test_pasted_controls_never_get_into_a_field)
async def test_text_that_names_no_file_is_said_in_the_dialog(action: str, text: str, says: str) -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        dialog = await _open(pilot, action)
        dialog.query_one(Input).value = text
        await pilot.press("enter")
        assert app.screen is dialog and says in _message(dialog)
        assert app.is_running


@pytest.mark.parametrize("text, says", [("~no-such-user-graphtop/x", "no such user"), ("a\x00b", "NUL")])
async def test_open_trace_with_text_that_names_no_file_is_a_toast(text: str, says: str) -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app.open_trace(text)
        await pilot.pause()
        assert any(t == "cannot open trace" and says in m for t, m in toasts(app))
        assert app.is_running


async def test_a_fallback_reason_with_markup_and_controls_hovers_safely() -> None:
    """A remote engine names its own reasons: the steps table, the fallback list and their tooltips
    (Textual parses a plain-string tooltip as markup) show it literally."""
    from graphtop.engine.telemetry.events import StepEvent
    from graphtop.tui.sessions.fake import boot_events

    reason = "[/] odd\x1b[31m [@click=app.quit]x[/]"
    steps = [
        StepEvent(
            step=i,
            phase="decode",
            batch_size=4,
            num_tokens=4,
            path="eager",
            fallback_reason=reason,
            host_ms=1.0,
            ts=100.0 + i,
        )
        for i in range(1, 6)
    ]
    app = make_app(FakeSession(boot_events() + steps))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        table = app.query_one("#steps-table")
        await pilot.hover("#steps-table", offset=(5, 1))
        await pilot.pause()
        assert table.tooltip is not None and "\x1b" not in str(table.tooltip)
        assert "[/] odd\u241b[31m" in str(table.tooltip)
        fallbacks = app.query_one("#fallbacks")
        lines = str(fallbacks.render()).splitlines()
        y = next(i for i, line in enumerate(lines) if "odd" in line)
        await pilot.hover("#fallbacks", offset=(10, y))
        await pilot.pause(0.6)  # the tooltip's own timer: Textual draws it now
        assert "[/] odd\u241b[31m" in str(fallbacks.tooltip)
        assert app.is_running


def test_a_cli_error_is_one_printable_line() -> None:
    from graphtop.tui.safe_text import error_line

    line = error_line("refused by the engine:\n\x1b]0;title\x07 [b]x[/b]\r\nend")
    assert line == "graphtop: error: refused by the engine: \u241b]0;title\u2407 [b]x[/b] end"


PASTE = "A\x1b]0;pwned\x07B\x1b[2JC\x00D\x9bE\ud800F"


async def test_pasted_controls_never_get_into_a_field() -> None:
    """A paste of ESC sequences, NUL, C1 or a lone surrogate was drawn raw in every input (retitling the
    window, clearing the screen) and went to the engine in a prompt: every field drops them now."""
    from textual import events

    from graphtop.tui.screens.bucket_editor import BucketEditorScreen
    from graphtop.tui.widgets.clean_input import CleanInput

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        prompt = app.query_one("#prompt", Input)
        assert isinstance(prompt, CleanInput) and app.focused is prompt
        prompt.post_message(events.Paste(PASTE))
        await pilot.pause()
        assert prompt.value == "A]0;pwnedB[2JCDEF" and prompt.cursor_position == len(prompt.value)
        for field in app.query(Input):
            assert isinstance(field, CleanInput), field  # the sampling row too
        await pilot.press("escape")
        dialog = await _open(pilot, "open_trace")
        dialog.query_one(Input).post_message(events.Paste(PASTE))
        await pilot.pause()
        assert dialog.query_one(Input).value == "A]0;pwnedB[2JCDEF"
        await pilot.press("escape")
        await leave_prompt(pilot)
        await pilot.press("b")
        await pilot.pause()
        editor = app.screen
        assert isinstance(editor, BucketEditorScreen)
        field = editor.query_one("#decode-input", Input)
        field.value = "1,\x1b[31m2"  # set directly: held to the same rule
        await pilot.pause()
        assert field.value == "1,[31m2"


async def test_the_bucket_editors_error_line_shows_controls_as_stand_ins(monkeypatch) -> None:
    """The editor's ✗ line quotes what was typed: drawn through printable(), never raw (defence in
    depth: the field already drops controls, but the error text is outside text all the same)."""
    from textual.widgets import Label

    from graphtop.engine.graphs import bucket_list
    from graphtop.tui.screens import bucket_editor

    def refuse(text: str, **_: object) -> list[int]:
        raise bucket_list.BucketSpecError("'\x1b]0;pwned\x07' is not an integer")

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await leave_prompt(pilot)
        await pilot.press("b")
        await pilot.pause()
        editor = app.screen
        monkeypatch.setattr(bucket_editor.BucketList, "parse", staticmethod(refuse))
        editor.query_one("#decode-input", Input).value = "1,2"
        await pilot.pause()
        shown = str(editor.query_one("#decode-msg", Label).render())
        assert "\u241b]0;pwned\u2407" in shown and "\x1b" not in shown


async def test_a_multi_line_paste_into_the_prompt_is_kept_whole() -> None:
    """Textual's Input kept only a paste's first line: the rest of a pasted prompt was lost silently."""
    from textual import events

    session = FakeSession()
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        prompt = app.query_one("#prompt", Input)
        prompt.post_message(events.Paste("Summarise this:\nfirst line\r\nsecond line\n"))
        await pilot.pause()
        assert prompt.value == "Summarise this: first line second line"
        await pilot.press("enter")
        await wait_until(pilot, lambda: bool(session.submitted))
        assert session.submitted[-1][0] == "Summarise this: first line second line"
