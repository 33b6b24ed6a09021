"""What a newcomer meets in the first minute and on an 80x24 terminal: keys typed at once reach the
prompt, toasts stay clear of it and go, the bucket editor's what-if and the replay bar's keys fit, help
gives each key one meaning, a written file's name reads whole, Open trace offers the traces at hand,
no scrollbar glyph sits in the steps rows, and free on a CPU reads the same in the dashboard and in
``trace summary``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.tui_pilot import make_app, open_path_prompt
from textual.widgets import Input, OptionList
from textual.widgets._toast import Toast

from graphtop.engine.telemetry.events import MemoryLedger
from graphtop.engine.trace_tools.ledger_words import FREE_ON_CPU
from graphtop.engine.trace_tools.report import format_summary
from graphtop.engine.trace_tools.summary import summarize
from graphtop.tui.early_keys import EarlyKeys
from graphtop.tui.path_choices import path_choices
from graphtop.tui.screens.bucket_editor import BucketEditorScreen
from graphtop.tui.screens.help import HelpScreen
from graphtop.tui.screens.path_prompt import PathPromptScreen
from graphtop.tui.sessions.fake import T0, FakeSession, boot_events, step_events
from graphtop.tui.sessions.replay import ReplaySession
from graphtop.tui.testing import leave_prompt, screen_text, settle, wait_until
from graphtop.tui.widgets.steps_table import StepsTable

SMALL = (80, 24)
BLOCKS = set("▁▂▃▄▅▆▇█▀▄")


class Typed:
    """A prompt that records what the held keys do to it."""

    def __init__(self) -> None:
        self.text = ""
        self.sent: list[str] = []

    def type_text(self, text: str) -> None:
        self.text += text

    def delete_left(self) -> None:
        self.text = self.text[:-1]

    def send_prompt(self) -> None:
        self.sent.append(self.text)
        self.text = ""


def test_held_keys_type_the_prompt_a_leading_slash_is_the_prompt_key() -> None:
    keys = EarlyKeys()
    typed = [
        ("slash", "/"),
        ("h", "h"),
        ("i", "i"),
        ("space", " "),
        ("x", "x"),
        ("backspace", None),
        ("slash", "/"),
        ("ctrl+j", "\n"),
        ("o", "o"),
        ("k", "k"),
        ("enter", "\r"),
    ]
    assert all(keys.hold(key, ch) for key, ch in typed)
    for key, ch in (("escape", "\x1b"), ("ctrl+q", "\x11"), ("up", None), ("f1", None)):
        assert not keys.hold(key, ch), key  # no text: the app handles it as usual (ctrl+q quits)
    prompt = Typed()
    keys.type_into(prompt)
    assert prompt.sent == ["hi /", "ok"] and prompt.text == "" and keys.keys == []


async def test_keys_typed_before_the_prompt_had_the_focus_are_its_own() -> None:
    """Until the prompt can take keys the app holds the text keys (a burst typed before the first frame:
    the space paused the live view and the prompt was lost); then they are typed into it and sent."""
    session = FakeSession()
    app = make_app(session)
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        prompt = app.query_one("#prompt", Input)
        assert app.focused is prompt and app._early_keys is None  # the focus from the first frame
        app._early_keys = EarlyKeys()  # as it is from the app's start until the screen is ready
        app.screen.set_focus(None)
        await pilot.press("slash", *"tell me a story", "enter", *"and")
        assert not app.paused and not session.submitted and prompt.value == ""
        app._prompt_takes_keys()
        await pilot.pause()
        assert [s[0] for s in session.submitted] == ["tell me a story"]
        assert prompt.value == "and" and app.focused is prompt and not app.paused


async def test_a_replay_holds_no_keys_and_focuses_nothing() -> None:
    app = make_app(ReplaySession(boot_events() + step_events(5), paused=True))  # type: ignore[arg-type]
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        assert app._early_keys is None and app.focused is None
        await pilot.press("space")
        assert app.session.replay.paused is False  # space is the replay's pause key at once


async def test_a_toast_stands_above_the_prompt_and_the_screen_is_repainted_once_it_goes(monkeypatch) -> None:
    app = make_app()
    async with app.run_test(size=SMALL, notifications=True) as pilot:
        await settle(pilot)
        app.notify(
            "demo model: tiny Qwen3-family model with random weights — output is gibberish by design",
            title="engine",
            severity="warning",
            timeout=1.5,
        )
        # The toast lives 1.5 s: long enough to be measured on a loaded CI runner, short enough to wait out.
        await wait_until(pilot, lambda: bool(app.screen.query(Toast)))
        toast, prompt = app.screen.query_one(Toast), app.query_one("#prompt")
        assert toast.region.bottom <= prompt.region.y, (toast.region, prompt.region)
        repainted: list[bool] = []
        monkeypatch.setattr(type(app.screen), "refresh", lambda self, *a, **k: repainted.append(not a and not k))
        await wait_until(pilot, lambda: not app.screen.query(Toast) and any(repainted), timeout=8)


async def test_the_bucket_editor_shows_its_what_if_and_the_status_line_at_80x24() -> None:
    app = make_app(FakeSession(boot_events() + step_events(60)))
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        await leave_prompt(pilot)
        await pilot.press("b")
        await pilot.pause()
        assert isinstance(app.screen, BucketEditorScreen) and app.screen.has_class("-short")
        lines = screen_text(app).splitlines()
        assert lines[0].startswith(" graphtop ")  # the status line stays in view
        text = "\n".join(lines)
        for row in (
            "what-if",
            "graph hit rate",
            "padding waste",
            "est. graph memory",
            "est. recapture work",
            "Recapture",
            "escape cancel",
        ):
            assert row in text, row
        body = app.screen.query_one("#editor-body")
        assert body.max_scroll_y == 0  # nothing scrolled out of sight
        await pilot.press("ctrl+u", *"1,2,4")
        assert "✓ 3 buckets: 1,2,4" in screen_text(app)


@pytest.mark.parametrize("detaches", [False, True], ids=["graphtop", "attach"])
async def test_help_gives_each_key_one_meaning_and_wraps_under_its_text(detaches: bool) -> None:
    session = FakeSession(boot_events())
    session.detaches = detaches
    app = make_app(session)
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        await pilot.press("f1")
        help_screen = app.screen
        assert isinstance(help_screen, HelpScreen)
        keys = help_screen.text.split("typing a prompt")[0]
        quit_row = next(line for line in keys.splitlines() if line.strip().startswith("^q"))
        assert ("Detach" in quit_row) == detaches and ("Quit —" in quit_row) != detaches
        assert "Detach —" not in keys if not detaches else "Quit —" not in keys
        assert "−5s" not in keys and "back to the live engine" not in keys  # replay keys: not in a live view
        entries = list(help_screen.query(".help-entry"))
        assert entries
        wrapped = 0
        for entry in entries:
            term, text = entry.children
            assert text.region.x == term.region.right  # the text starts in its own column …
            wrapped += text.region.height > 1  # … and a wrapped line stays there
        assert wrapped


async def test_the_replay_bar_says_every_key_and_the_way_back_to_live_at_80x24(tmp_path: Path) -> None:
    session = FakeSession(boot_events() + step_events(20))
    app = make_app(session)
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        app.switch_session(ReplaySession(boot_events() + step_events(20), paused=True, label="t.jsonl"))
        await pilot.pause()
        lines = screen_text(app).splitlines()
        keys = next(line for line in lines if "+/- speed" in line)
        assert "space pause" in keys and "l back to live" in keys, keys
        assert "l Live" in lines[-1]
        await pilot.press("l")
        assert app.session is session and app.dashboard.replay is False
    alone = make_app(ReplaySession(boot_events(), paused=True))  # type: ignore[arg-type]
    async with alone.run_test(size=SMALL) as pilot:  # graphtop --replay: no live engine to go back to
        await settle(pilot)
        text = screen_text(alone)
        assert "space pause" in text and "back to live" not in text and "l Live" not in text


async def test_an_export_toast_keeps_the_file_name_whole_at_80x24(tmp_path: Path) -> None:
    folder = tmp_path / "a-rather-long-folder-name" / "with-another-long-folder-inside-it"
    folder.mkdir(parents=True)
    app = make_app(FakeSession(boot_events() + step_events(5)))
    async with app.run_test(size=SMALL, notifications=True) as pilot:
        await settle(pilot)
        app._export_to(str(folder / "graphtop-20250101-120000.jsonl"))
        await wait_until(pilot, lambda: bool(app.screen.query(Toast)))
        await pilot.pause(0.05)
        assert "graphtop-20250101-120000.jsonl" in screen_text(app)


async def test_open_trace_offers_the_folders_traces_newest_first(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    from graphtop.engine.telemetry.trace_writer import write_trace

    for i, name in enumerate(("old-run.jsonl", "run-2.jsonl", "newest.jsonl")):
        write_trace(str(tmp_path / name), boot_events() + step_events(3))
        os.utime(tmp_path / name, (1_700_000_000 + i, 1_700_000_000 + i))
    (tmp_path / "notes.txt").write_text("not a trace")
    (tmp_path / "runs").mkdir()
    assert [c.value for c in path_choices("", ".jsonl")] == ["newest.jsonl", "run-2.jsonl", "old-run.jsonl", "runs/"]
    assert [c.value for c in path_choices("r", ".jsonl")] == ["run-2.jsonl", "runs/"]
    assert path_choices("no-such-folder/x", ".jsonl") == []
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        dialog = await open_path_prompt(pilot, "open_trace")
        assert isinstance(dialog, PathPromptScreen)
        options = dialog.query_one("#path-choices", OptionList)
        assert options.display and options.option_count == 4
        await pilot.press("r")
        await pilot.pause(0.2)
        field = dialog.query_one(Input)
        assert options.option_count == 2 and field._suggestion == "run-2.jsonl"  # inline, → takes it
        assert "run-2.jsonl" in screen_text(app)
        await pilot.press("down", "enter")
        await wait_until(pilot, lambda: app.session.kind == "replay")
        assert app.session.replay.path.endswith("run-2.jsonl")


@pytest.mark.parametrize("size", [(120, 40), (200, 50)])
async def test_no_scrollbar_glyph_in_the_steps_rows(size: tuple[int, int]) -> None:
    app = make_app(FakeSession(boot_events() + step_events(60)))
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        table = app.query_one(StepsTable)
        assert table.max_scroll_y > 0  # more rows than fit: a scrollbar would be drawn
        region = table.region
        lines = screen_text(app).splitlines()[region.y : region.bottom]
        for line in lines:
            assert not BLOCKS & set(line[region.x : region.right]), line


async def test_free_on_a_cpu_reads_the_same_in_the_dashboard_and_in_trace_summary() -> None:
    ledger = MemoryLedger(device="cpu", total=516 << 20, weights=4 << 20, kv_pool=512 << 20, ts=T0 + 1)
    summary = format_summary(summarize([ledger]))
    free = next(line for line in summary.splitlines() if line.strip().startswith("free"))
    assert FREE_ON_CPU in free and "0 B" not in free
    cuda = format_summary(summarize([MemoryLedger(device="cuda:0", total=8 << 30, free=1 << 30)]))
    assert "1.0 GiB" in next(line for line in cuda.splitlines() if line.strip().startswith("free"))
    app = make_app(FakeSession([ledger]))
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot)
        assert f"free           {FREE_ON_CPU}" in screen_text(app)
