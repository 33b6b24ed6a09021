"""Pilot tests of the dashboard's dialogs: typing goes in at once, Enter confirms, Escape cancels, the
hint says so, the palette never stacks over a dialog, screenshots say where they went."""

from __future__ import annotations

from pathlib import Path

from support.tui_pilot import make_app
from support.tui_pilot import open_path_prompt as _open
from textual.command import CommandPalette
from textual.widgets import Input, Label

from graphtop.tui.screens.bucket_editor import BucketEditorScreen
from graphtop.tui.screens.path_prompt import PathPromptScreen
from graphtop.tui.sessions.fake import FakeSession
from graphtop.tui.testing import leave_prompt, settle, wait_until

SIZE = (120, 40)


def messages(app) -> list[str]:
    return [n.message for n in app._notifications]


async def _refused_in_dialog(pilot, action: str, path: Path) -> PathPromptScreen:
    """Open ``action``'s dialog, enter ``path``: the dialog stays and says it is a FIFO, in one line."""
    dialog = await _open(pilot, action)
    dialog.query_one(Input).value = str(path)
    await pilot.press("enter")
    assert pilot.app.screen is dialog
    said = str(dialog.query_one("#path-message").render())
    assert "is a FIFO" in said and "\n" not in said
    return dialog


async def test_export_dialog_takes_typing_and_enter_at_once(tmp_path: Path) -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        dialog = await _open(pilot, "export_trace")
        field = dialog.query_one(Input)
        assert app.focused is field  # no Tab needed
        assert str(dialog.query_one("#path-hint", Label).render()) == "enter exports · escape cancels"
        assert f"{len(app.state.recorded):,} events in memory" in str(dialog.query_one("#path-detail").render())
        target = tmp_path / "run.jsonl"
        await pilot.press("ctrl+u", *str(target))
        assert field.value == str(target)
        await pilot.press("enter")
        assert not isinstance(app.screen, PathPromptScreen)
        await wait_until(pilot, lambda: any(f"{target.name}\nin {target.parent}" in m for m in messages(app)))
        assert target.exists() and target.read_text().count("\n") > len(app.state.recorded)  # header + events


async def test_escape_cancels_a_dialog_and_writes_nothing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await _open(pilot, "export_trace")
        await pilot.press("x", "escape")
        assert not isinstance(app.screen, PathPromptScreen)
        await pilot.pause(0.2)
        assert list(tmp_path.iterdir()) == []


async def test_open_trace_dialog_enter_opens_the_replay(tmp_path: Path) -> None:
    app = make_app()
    target = tmp_path / "t.jsonl"
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app._export_to(str(target))
        await wait_until(
            pilot, lambda: target.exists() and any("trace exported" == n.title for n in app._notifications)
        )
        dialog = await _open(pilot, "open_trace")
        assert "enter opens · → completes · ↓ the list · escape cancels" == str(dialog.query_one("#path-hint").render())
        await pilot.press(*str(target), "enter")
        await wait_until(pilot, lambda: app.session.kind == "replay")


async def test_palette_does_not_stack_over_a_dialog() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("ctrl+p")  # on the dashboard it opens
        await wait_until(pilot, lambda: CommandPalette.is_open(app))
        await pilot.press("escape")
        await wait_until(pilot, lambda: not CommandPalette.is_open(app))
        for action in ("export_trace", "open_trace", "screenshot_prompt"):
            dialog = await _open(pilot, action)
            await pilot.press("ctrl+p")
            await pilot.pause()
            assert app.screen is dialog and not CommandPalette.is_open(app)
            await pilot.press("escape")
        await leave_prompt(pilot)
        await pilot.press("b")
        assert isinstance(app.screen, BucketEditorScreen)
        await pilot.press("ctrl+p")
        await pilot.pause()
        assert isinstance(app.screen, BucketEditorScreen) and not CommandPalette.is_open(app)
        await pilot.press("escape", "question_mark")
        help_screen = app.screen
        await pilot.press("b", "c", "space")  # dashboard keys do not act behind a dialog
        assert app.screen is help_screen and not app.paused


async def test_bucket_editor_takes_typing_at_once_and_says_its_keys() -> None:
    session = FakeSession()
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await leave_prompt(pilot)
        await pilot.press("b")
        editor = app.screen
        assert isinstance(editor, BucketEditorScreen)
        assert app.focused is editor.query_one("#decode-input")
        hints = " ".join(str(h.render()) for h in editor.query(".modal-hint"))
        assert "enter/ctrl+s recapture" in hints and "escape cancel" in hints
        await pilot.press("ctrl+u", *"1,2,4", "enter")
        assert session.recaptures == [([1, 2, 4], None)]


async def test_screenshot_saves_in_the_current_directory_and_says_where(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        commands = [c.title for c in app.get_system_commands(app.screen)]
        assert commands.count("Screenshot") == 1  # graphtop's, not textual's
        dialog = await _open(pilot, "screenshot_prompt")
        assert str(tmp_path) in str(dialog.query_one("#path-detail").render())
        await pilot.press("enter")  # the suggested name, in the current directory
        await wait_until(pilot, lambda: any(n.title == "screenshot saved" for n in app._notifications))
        (svg,) = tmp_path.glob("graphtop-*.svg")
        assert f"{svg.name}\nin {svg.parent}" in messages(app) and "<svg" in svg.read_text()
        assert "Save a screenshot" not in svg.read_text()  # taken after the dialog closed

        dialog = await _open(pilot, "screenshot_prompt")
        await pilot.press("ctrl+u", *"shots/", "enter")  # a folder: the default name inside it
        assert app.screen is dialog  # said in the dialog, which stays open
        assert "folder" in str(dialog.query_one("#path-message").render())
        assert "does not exist" in str(dialog.query_one("#path-message").render())
        await pilot.press("escape")
        (tmp_path / "shots").mkdir()
        path = app.save_screenshot_to("shots/")
        assert path is not None and path.parent == tmp_path / "shots" and path.exists()
        too_long = "x" * 300 + ".svg"  # the OS refuses the name: the reason is said, not just "failed"
        assert app.save_screenshot_to(too_long) is None
        await wait_until(
            pilot,
            lambda: any(
                n.title == "screenshot not saved" and "File name too long" in n.message for n in app._notifications
            ),
        )


async def test_escape_closes_the_palette_key_panel() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app.action_show_help_panel()
        await pilot.pause()
        assert app.screen.query("HelpPanel")
        await pilot.press("escape")
        await pilot.pause()
        assert not app.screen.query("HelpPanel")


async def test_exporting_over_the_trace_being_replayed_is_refused(tmp_path: Path) -> None:
    """The replay may not have read its file to the end: the export says why and leaves it whole."""
    from graphtop.engine.telemetry.trace_writer import write_trace
    from graphtop.tui.sessions.fake import boot_events, step_events
    from graphtop.tui.sessions.replay import ReplaySession

    trace = tmp_path / "run.jsonl"
    write_trace(str(trace), boot_events() + step_events(20))
    before = trace.read_bytes()
    app = make_app(ReplaySession.from_path(str(trace), paused=True))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        dialog = await _open(pilot, "export_trace")
        dialog.query_one(Input).value = str(trace)
        await pilot.press("enter")  # said in the dialog, before any "replace it?" question
        assert app.screen is dialog
        assert "same file as the open trace" in str(dialog.query_one("#path-message").render())
        await pilot.press("enter")
        assert app.screen is dialog
        app._export_to(str(trace))  # the action itself refuses too (the palette's path)
        await wait_until(pilot, lambda: any("same file as the open trace" in m for m in messages(app)))
    assert trace.read_bytes() == before


async def test_a_trace_is_read_off_the_ui_thread_and_only_the_newest_open_wins(tmp_path: Path, monkeypatch) -> None:
    """A long run's trace was parsed on the UI thread: keys and live panels froze until it was read."""
    import threading

    from graphtop.tui.sessions.replay import ReplaySession

    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    app = make_app()
    gates = {str(first): threading.Event(), str(second): threading.Event()}
    read = ReplaySession.from_path

    def slow_read(path: str, **kwargs):
        assert threading.current_thread() is not threading.main_thread()
        gates[path].wait(10)
        return read(path, **kwargs)

    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        for target in (first, second):
            app._export_to(str(target))
            await wait_until(pilot, lambda: target.exists())
        monkeypatch.setattr(ReplaySession, "from_path", staticmethod(slow_read))
        live = app.session
        reading_first = app.open_trace(str(first))
        await pilot.press("f1")  # the help screen comes up while the trace is being read
        await pilot.pause()
        assert app.screen is not app.dashboard and app.session is live
        await pilot.press("escape")
        reading_second = app.open_trace(str(second))  # a newer open: the first one's result is dropped
        gates[str(first)].set()
        await reading_first.wait()
        await pilot.pause()
        assert app.session is live
        gates[str(second)].set()
        await reading_second.wait()
        await wait_until(pilot, lambda: app.session.kind == "replay")
        assert app.session.path == str(second)
        app.action_back_to_live()
        gates[str(first)].clear()
        reading = app.open_trace(str(first))
        app.action_back_to_live()  # going back while it is read: it does not take the panels afterwards
        gates[str(first)].set()
        await reading.wait()
        await pilot.pause()
        assert app.session is live


async def test_open_trace_refuses_a_fifo_in_the_dialog(tmp_path: Path) -> None:
    """Opening a FIFO blocks until a writer comes: the dashboard froze. The dialog says why and stays."""
    import os

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        dialog = await _refused_in_dialog(pilot, "open_trace", fifo)
        assert app.session.kind != "replay"
        app.open_trace(str(fifo))  # the action itself refuses too (a toast)
        await wait_until(pilot, lambda: any("is a FIFO" in m for m in messages(app)))
        dialog.query_one(Input).value = str(tmp_path)
        await pilot.press("enter")  # a folder: said in the dialog too
        assert app.screen is dialog and "is a folder" in str(dialog.query_one("#path-message").render())


async def test_export_trace_refuses_a_fifo_and_leaves_no_thread_waiting(tmp_path: Path) -> None:
    """A FIFO with no reader: the export worker waited in open() forever, said nothing, and the process
    could not exit. The dialog says why and stays open; the action refuses it too."""
    import os
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    before = set(threading.enumerate())
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await _refused_in_dialog(pilot, "export_trace", fifo)
        await pilot.press("escape")
        app._export_to(str(fifo))  # the palette's path
        await wait_until(pilot, lambda: any("is a FIFO" in m for m in messages(app)))
        app._export_worker(str(fifo), [])  # the worker checks again before it opens
        await wait_until(pilot, lambda: sum("is a FIFO" in m for m in messages(app)) == 2)
    left = [t for t in set(threading.enumerate()) - before if t.is_alive() and not t.name.startswith("asyncio_")]
    assert not left  # asyncio's own executor thread idles; no worker waits in open()


async def test_export_to_a_folder_that_does_not_exist_is_said_in_the_dialog(tmp_path: Path) -> None:
    """A path the export cannot write is said in the dialog, which stays open to fix it (docs/dashboard.md,
    dialogs), rather than closing and toasting."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        dialog = await _open(pilot, "export_trace")
        dialog.query_one(Input).value = str(tmp_path / "nowhere" / "run.jsonl")
        await pilot.press("enter")
        assert app.screen is dialog
        said = str(dialog.query_one("#path-message").render())
        assert f"folder {tmp_path / 'nowhere'} does not exist" in said and "\n" not in said
        dialog.query_one(Input).value = "/proc/graphtop-test.jsonl"  # a folder no file can be created in
        await pilot.press("enter")
        assert app.screen is dialog and "cannot create a file in /proc" in str(
            dialog.query_one("#path-message").render()
        )
        dialog.query_one(Input).value = str(tmp_path / "run.jsonl")
        await pilot.press("enter")
        assert not isinstance(app.screen, PathPromptScreen)
        await wait_until(pilot, lambda: (tmp_path / "run.jsonl").exists())
