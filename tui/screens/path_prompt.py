"""A one-field dialog asking for a file path (export trace, open trace, screenshot).

Works the way a Textual dialog should: the field has the focus when it opens (``AUTO_FOCUS``; the
app itself starts with no focus so single keys work), Enter confirms, Escape cancels, and the hint
says both, under whatever the caller wants to say (how many events, which folder).

A dialog that writes (``target`` given) never replaces a file on one keystroke: Enter on the path of an
existing file says so in the dialog, and only a second Enter on the same text goes ahead. Text that
names no file (a NUL, an unknown ``~user``) is said there too, and the dialog stays open; so is a
file a reading dialog (``source`` given) refuses, such as a FIFO that would block the open.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Optional

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Input, Label, Static

from ..widgets.clean_input import CleanInput
from ..safe_text import printable


class PathPromptScreen(ModalScreen[Optional[str]]):
    """Returns the entered path, or None when cancelled."""

    AUTO_FOCUS = "Input"
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="path.cancel", tooltip="Close without doing anything")]

    def __init__(self, title: str, value: str = "", detail: str = "", *, verb: str = "confirms",
                 target: Optional[Callable[[str], Path]] = None,
                 source: Optional[Callable[[str], Path]] = None) -> None:
        """``detail``: a line about the operation (shown above the key hint); ``verb``: what Enter
        does (``"exports"``, ``"opens"``, ``"saves"``); ``target``: for a dialog that writes, the file
        the typed text names (raises ``ValueError`` or ``OSError`` for text that names none); ``source``:
        for a dialog that reads, the same for the file to read (a FIFO, which would block, is refused
        there, and the dialog stays open)."""
        super().__init__()
        self.title_text = title
        self.value = value
        self.detail = detail
        self.verb = verb
        self.target = target
        self.source = source
        self._replace_confirmed_for: Optional[str] = None

    def compose(self) -> ComposeResult:
        with Vertical(id="path-box", classes="modal-box"):
            yield Label(self.title_text, classes="modal-title")
            yield CleanInput(self.value, id="path-input", select_on_focus=False)
            if self.detail:
                yield Label(self.detail, id="path-detail", classes="modal-detail")
            message = Static("", id="path-message")
            message.display = False  # shown once there is something to say
            yield message
            yield Label(f"enter {self.verb} · escape cancels", id="path-hint", classes="modal-hint")

    def _say(self, markup: str, **values: str) -> None:
        message = self.query_one("#path-message", Static)
        message.update(Content.from_markup(markup, **{k: printable(v) for k, v in values.items()}))
        message.display = True

    @on(Input.Submitted)
    def _submit(self, event: Input.Submitted) -> None:
        event.stop()
        value = event.value.strip()
        check = self.target or self.source
        if value and check is not None:
            try:
                path = check(value)
            except (ValueError, OSError) as exc:
                self._say("[$error]✗ $m[/]", m=str(exc) if isinstance(exc, ValueError) else f"{value}: {exc.strerror or exc}")
                return
            if self.target is not None and os.path.isfile(path) and value != self._replace_confirmed_for:
                self._replace_confirmed_for = value
                self._say("[$warning]$p exists: enter again replaces it[/]", p=str(path))
                return
        self.dismiss(value or None)

    def action_cancel(self) -> None:
        self.dismiss(None)
