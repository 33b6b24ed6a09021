"""The dashboard's file actions: export a trace, open one (replay), save a screenshot.

A mixin of :class:`~graphtop.tui.app.GraphtopApp`. Each asks for a path in a dialog prefilled with a
name in the current directory, and each says where it wrote, or why it could not: Textual's own
screenshot command saves to a downloads folder that may not exist and reports only "failed".
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Optional

from textual import work
from textual.app import SystemCommand
from textual.screen import Screen

from graphtop.engine.telemetry.safe_write import OutputPathError, check_distinct, check_output, write_atomic
from graphtop.engine.telemetry.trace_writer import write_trace

from .app_actions import AppActions
from .screens.path_prompt import PathPromptScreen
from .sessions.replay import ReplaySession
from .special_files import is_fifo, special_kind
from .state import DashboardState

if TYPE_CHECKING:
    from textual.worker import Worker

    from graphtop.engine.telemetry.events import Event

    from .sessions.base import Session


def stamped(prefix: str, suffix: str) -> str:
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}{suffix}"


def name_then_folder(path: "str | Path") -> str:
    """A written file for a toast: its name whole on one line, ``in`` its folder on the next.

    Why: a toast is 40 columns wide on an 80-column terminal; a full path wrapped there split the file
    name, the part the user wants to read back."""
    p = Path(path)
    return f"{p.name}\nin {p.parent}"


class PathTextError(ValueError):
    """Typed text that names no file at all; the message is one line."""


def path_from_text(text: str) -> Path:
    """The path typed text names, ``~`` expanded; :class:`PathTextError` when it cannot name a file.

    Why: ``open`` raises ``ValueError`` for a NUL, ``UnicodeEncodeError`` for a lone surrogate and
    ``expanduser`` ``RuntimeError`` for an unknown ``~user``; none of those is an ``OSError``, so each
    crashed a dialog (or, in the export worker, failed without a word).
    """
    if "\x00" in text:
        raise PathTextError("a path cannot contain a NUL character")
    try:
        os.fsencode(text)
    except UnicodeEncodeError:
        raise PathTextError("the path has characters no file name can hold") from None
    try:
        return Path(text).expanduser()
    except RuntimeError:
        raise PathTextError(f"{text.split(os.sep, 1)[0]}: no such user, so no home folder to expand") from None


def trace_to_open(text: str) -> Path:
    """The trace file typed text names; :class:`PathTextError` for a folder, FIFO, socket or device.

    Why: opening a FIFO waits for a writer, and the reading worker would hold up the dashboard's exit
    (``graphtop --replay`` reads a FIFO by design; the dashboard does not). A folder is said in the
    dialog too, which stays open; a missing file is left to the reader's own words.
    """
    path = path_from_text(text)
    kind = "a folder" if path.is_dir() else special_kind(path)
    if kind is not None:
        raise PathTextError(
            f"{path} is {kind}, not a trace file: the dashboard opens regular files only "
            "(graphtop --replay reads a FIFO)"
        )
    return path


def resolve_target(text: str, default_name: str) -> Path:
    """The file a typed path names: ``~`` expanded, relative to the current directory, and a
    folder (an existing one, or text ending in a slash) gets ``default_name`` inside it."""
    path = path_from_text(text)
    if text.endswith(("/", os.sep)) or path.is_dir():
        path = path / default_name
    return path.absolute()


def writable_target(text: str, default_name: str, label: str) -> Path:
    """``resolve_target``, held to the rules the write applies (``safe_write.check_output``: a folder
    that does not exist, a link, a socket; ``probe``: a folder no file can be created in, such as
    /proc or a read-only mount), so a dialog says why in place and stays open instead of closing and
    toasting. Raises ``OutputPathError`` or ``PathTextError`` (both one line)."""
    target = resolve_target(text, default_name)
    check_output(target, label, probe=True)
    return target


def refuse_fifo_export(target: "str | Path") -> None:
    """An export never opens a FIFO: with no reader the worker would wait in open() forever and hold up
    the dashboard's exit (``graphtop --record`` writes one by design; the dashboard does not)."""
    if is_fifo(target):
        raise PathTextError(
            f"{target} is a FIFO: the dashboard would wait for a reader forever; give a file "
            "path (graphtop --record writes a FIFO)"
        )


class FileActions(AppActions):
    """Export trace, open trace, back to live, screenshot."""

    _trace_opening: Optional[str] = None  # the trace a reading worker is loading for the panels, if any
    host_files = True
    """False in a browser tab of ``graphtop web``: whoever holds the browser is not a user of this host, so
    the dashboard neither writes (export, screenshot) nor reads (open trace) its files for them."""

    def _no_host_files(self, what: str) -> bool:
        """True (and says why) when ``what`` would touch this host's files from a browser tab."""
        if self.host_files:
            return False
        self.notify(
            "a browser tab does not read or write files on the dashboard's host; use graphtop attach there",
            title=f"no {what} from a browser",
            severity="warning",
        )
        return True

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """Textual's palette commands, with graphtop's screenshot (a path, and a reason on failure)."""
        for command in super().get_system_commands(screen):
            if command.title != "Screenshot":
                yield command
        yield SystemCommand(
            "Screenshot",
            "Save an SVG screenshot (asks where; the current directory by default)",
            self.action_screenshot_prompt,
        )

    # ------------------------------------------------------------------ screenshot
    def action_screenshot_prompt(self) -> None:
        if self._no_host_files("screenshot"):
            return
        name = stamped("graphtop", ".svg")
        self.push_screen(
            PathPromptScreen(
                "Save a screenshot (SVG)",
                name,
                f"in {Path.cwd()}",
                verb="saves",
                target=lambda text: writable_target(text, name, "screenshot"),
                blink=self.animate,
            ),
            callback=self._screenshot_to,
        )

    def _screenshot_to(self, text: Optional[str]) -> None:
        if text:  # after the dialog is gone, so the picture is of the dashboard
            self.call_after_refresh(self.save_screenshot_to, text)

    def save_screenshot_to(self, text: str) -> Optional[Path]:
        """Write the current screen as SVG; say where, or why not. Returns the path written."""
        target: object = text
        try:
            target = resolve_target(text, stamped("graphtop", ".svg"))
            if not target.parent.is_dir():
                self.notify(f"folder {target.parent} does not exist", title="screenshot not saved", severity="error")
                return None
            svg = self.export_screenshot().encode("utf-8")
            write_atomic(target, lambda f: f.write(svg), "screenshot")  # never half a file over an old one
        except (PathTextError, OutputPathError) as exc:
            self.notify(str(exc), title="screenshot not saved", severity="error")
            return None
        except OSError as exc:
            self.notify(f"{target}: {exc.strerror or exc}", title="screenshot not saved", severity="error")
            return None
        self.notify(name_then_folder(target), title="screenshot saved")
        return target

    # ------------------------------------------------------------------ traces
    def action_export_trace(self) -> None:
        if self._no_host_files("export"):
            return
        events = len(self.state.recorded)
        name = stamped("graphtop", ".jsonl")
        self.push_screen(
            PathPromptScreen(
                "Export trace (JSONL)",
                name,
                f"{events:,} events in memory · saved in {Path.cwd()}",
                verb="exports",
                target=lambda text: self._export_target(text, name),
                blink=self.animate,
            ),
            callback=self._export_to,
        )

    def _export_target(self, text: str, default_name: str) -> Path:
        """The file an export of ``text`` writes; refused (in the dialog) when it is the trace being played."""
        target = writable_target(text, default_name, "export")
        refuse_fifo_export(target)
        replay = self.session.replay
        check_distinct([("export", target)], [("the open trace", replay.path if replay is not None else None)])
        return target

    def _export_to(self, path: Optional[str]) -> None:
        if path:
            try:
                target = self._export_target(path, stamped("graphtop", ".jsonl"))
            except (PathTextError, OutputPathError) as exc:
                self.notify(str(exc), title="export failed", severity="error")
                return
            except OSError as exc:
                self.notify(f"{path}: {exc.strerror or exc}", title="export failed", severity="error")
                return
            self._export_worker(str(target), list(self.state.recorded))

    @work(thread=True, group="export", exit_on_error=False)
    def _export_worker(self, path: str, events: list["Event"]) -> None:
        """Writing a large trace takes a while; do it off the UI thread and report once."""
        replay = self.session.replay
        source = replay.path if replay is not None else None  # never export over the trace being played
        try:
            refuse_fifo_export(path)  # again: a FIFO may have taken its place since (write_trace checks the rest)
            n = write_trace(path, events, meta={"source": "graphtop tui", "label": self.session.label}, source=source)
        except OSError as exc:
            self.call_from_thread(
                self.notify, f"{path}: {exc.strerror or exc}", title="export failed", severity="error"
            )
        except (OutputPathError, PathTextError) as exc:
            self.call_from_thread(self.notify, str(exc), title="export failed", severity="error")
        except Exception as exc:  # noqa: BLE001 - the worker's errors are not raised anywhere: say them
            self.call_from_thread(
                self.notify, f"{path}: {type(exc).__name__}: {exc}", title="export failed", severity="error"
            )
        else:
            left_out = sum(1 for ev in events if ev.type != "trace_header") - n  # the reader would refuse them
            note = f"\n({left_out:,} left out: numbers a trace cannot hold, e.g. NaN)" if left_out else ""
            self.call_from_thread(self.notify, f"{n:,} events → {name_then_folder(path)}{note}", title="trace exported")

    def action_open_trace(self) -> None:
        if self._no_host_files("trace to open"):
            return
        self.push_screen(
            PathPromptScreen(
                "Open trace",
                "",
                f"a .jsonl trace written by graphtop · from {Path.cwd()}",
                verb="opens",
                source=trace_to_open,
                choices=".jsonl",
                blink=self.animate,
            ),
            callback=self.open_trace,
        )

    def open_trace(self, path: Optional[str]) -> "Optional[Worker[None]]":
        """Switch the panels to a replay of ``path`` once it is read (the live engine keeps running).

        Why a worker: a trace of a long run is many megabytes of JSON; read on the UI thread it froze the
        dashboard (keys, the live panels) until done. Returns the reading worker, or None when the text
        names no regular file (said in a toast at once)."""
        if not path:
            return None
        try:
            target = trace_to_open(path)
        except PathTextError as exc:
            self.notify(str(exc), title="cannot open trace", severity="error")
            return None
        self._trace_opening = str(target)  # the newest request wins: an older read finishing late is dropped
        return self._read_trace_worker(str(target))

    @work(thread=True, group="open-trace", exit_on_error=False)
    def _read_trace_worker(self, path: str) -> None:
        from graphtop.engine.trace_tools.trace import TraceError

        try:
            replay = ReplaySession.from_path(path)
        except TraceError as exc:
            self.call_from_thread(self._trace_not_opened, path, str(exc))
        except Exception as exc:  # noqa: BLE001 - the worker's errors are not raised anywhere: say them
            self.call_from_thread(self._trace_not_opened, path, f"{path}: {type(exc).__name__}: {exc}")
        else:
            self.call_from_thread(self._trace_read, path, replay)

    def _trace_read(self, path: str, replay: ReplaySession) -> None:
        if self._trace_opening == path:
            self._trace_opening = None
            self.switch_session(replay)

    def _trace_not_opened(self, path: str, message: str) -> None:
        if self._trace_opening == path:
            self._trace_opening = None
            self.notify(message, title="cannot open trace", severity="error")

    def switch_session(self, session: "Session") -> None:
        """Show ``session`` in the panels; the live session (if any) keeps being drained."""
        self.session = session
        if session is self.live_session and self.live_state is not None:
            self.state = self.live_state
        else:
            self.state = DashboardState()
            session.start()
        self.apply_mode()
        self.render_all(force=True)

    def action_back_to_live(self) -> None:
        self._trace_opening = None  # a trace still being read does not take the panels back afterwards
        if self.live_session is not None:
            self.switch_session(self.live_session)
