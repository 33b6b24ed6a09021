"""A one-field dialog asking for a file path (export trace, open trace, screenshot).

Works the way a Textual dialog should: the field has the focus when it opens (``AUTO_FOCUS``; the
app itself starts with no focus so single keys work), Enter confirms, Escape cancels, and the hint
says both, under whatever the caller wants to say (how many events, which folder).

A dialog that writes (``target`` given) never replaces a file on one keystroke: Enter on the path of an
existing file says so in the dialog, and only a second Enter on the same text goes ahead. Text that
names no file (a NUL, an unknown ``~user``) is said there too, and the dialog stays open; so is a
file a reading dialog (``source`` given) refuses, such as a FIFO that would block the open.

A dialog that opens a kind of file (``choices``, e.g. ".jsonl") lists the folder's files of that kind
under the field as you type, newest first, and shows the first one inline (→ takes it): ↓ moves into
the list, enter there opens the file (or goes into a folder).
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
from textual.widgets import Input, Label, OptionList, Static
from textual.widgets.option_list import Option

from ..path_choices import PathSuggester, path_choices
from ..safe_text import printable
from ..widgets.clean_input import CleanInput
from .dialog import Dialog


class PathPromptScreen(Dialog[Optional[str]]):
    """Returns the entered path, or None when cancelled."""

    AUTO_FOCUS = "Input"
    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="path.cancel", tooltip="Close without doing anything"),
        Binding(
            "down",
            "to_choices",
            "Choices",
            show=False,
            id="path.choices",
            tooltip="Into the list of files under the field",
        ),
    ]

    def __init__(
        self,
        title: str,
        value: str = "",
        detail: str = "",
        *,
        verb: str = "confirms",
        target: Optional[Callable[[str], Path]] = None,
        source: Optional[Callable[[str], Path]] = None,
        choices: Optional[str] = None,
        blink: bool = True,
    ) -> None:
        """``detail``: a line about the operation (shown above the key hint); ``verb``: what Enter
        does (``"exports"``, ``"opens"``, ``"saves"``); ``target``: for a dialog that writes, the file
        the typed text names (raises ``ValueError`` or ``OSError`` for text that names none); ``source``:
        for a dialog that reads, the same for the file to read (a FIFO, which would block, is refused
        there, and the dialog stays open); ``choices``: the suffix of the files to offer (``.jsonl``);
        ``blink``: the field's cursor blinks (off where the app does not animate: a picture of the dialog
        must not depend on when it is taken)."""
        super().__init__()
        self.title_text = title
        self.value = value
        self.detail = detail
        self.verb = verb
        self.target = target
        self.source = source
        self.choices = choices
        self._replace_confirmed_for: Optional[str] = None
        self._blink = blink

    def compose(self) -> ComposeResult:
        with Vertical(id="path-box", classes="modal-box"):
            yield Label(self.title_text, classes="modal-title")
            suggester = PathSuggester(self.choices) if self.choices else None
            yield CleanInput(self.value, id="path-input", select_on_focus=False, suggester=suggester)
            if self.choices:
                options = OptionList(id="path-choices")
                options.display = False  # shown while the folder has something to offer
                yield options
            if self.detail:
                yield Label(self.detail, id="path-detail", classes="modal-detail")
            message = Static("", id="path-message")
            message.display = False  # shown once there is something to say
            yield message
            keys = f"enter {self.verb} · → completes · ↓ the list" if self.choices else f"enter {self.verb}"
            yield Label(f"{keys} · escape cancels", id="path-hint", classes="modal-hint")

    def on_mount(self) -> None:
        self.query_one("#path-input", Input).cursor_blink = self._blink
        self._offer(self.value)

    @on(Input.Changed)
    def _changed(self, event: Input.Changed) -> None:
        self._offer(event.value)

    def _offer(self, text: str) -> None:
        """List the choices for ``text`` under the field (none: the list hides)."""
        if not self.choices:
            return
        options = self.query_one("#path-choices", OptionList)
        found = path_choices(text, self.choices)
        options.set_options(Option(Content(printable(c.value)), id=c.value) for c in found)
        options.display = bool(found)

    def action_to_choices(self) -> None:
        options = self.query("#path-choices")
        if options and options.first().display:
            options.first().focus()
            options.first(OptionList).highlighted = 0

    @on(OptionList.OptionSelected, "#path-choices")
    def _chosen(self, event: OptionList.OptionSelected) -> None:
        """A file is opened; a folder is gone into (the list then shows what it holds)."""
        event.stop()
        value = event.option.id or ""
        field = self.query_one("#path-input", Input)
        field.value = value
        field.cursor_position = len(value)
        if value.endswith(os.sep):
            field.focus()
            return
        self._confirm(value)

    def _say(self, markup: str, **values: str) -> None:
        message = self.query_one("#path-message", Static)
        message.update(Content.from_markup(markup, **{k: printable(v) for k, v in values.items()}))
        message.display = True

    @on(Input.Submitted)
    def _submit(self, event: Input.Submitted) -> None:
        event.stop()
        self._confirm(event.value.strip())

    def _confirm(self, value: str) -> None:
        """Enter on ``value``: checked where the dialog checks (it stays open to say why), then done."""
        check = self.target or self.source
        if value and check is not None:
            try:
                path = check(value)
            except (ValueError, OSError) as exc:
                self._say(
                    "[$error]✗ $m[/]", m=str(exc) if isinstance(exc, ValueError) else f"{value}: {exc.strerror or exc}"
                )
                return
            if self.target is not None and os.path.isfile(path) and value != self._replace_confirmed_for:
                self._replace_confirmed_for = value
                self._say("[$warning]$p exists: enter again replaces it[/]", p=str(path))
                return
        self.dismiss(value or None)

    def action_cancel(self) -> None:
        self.dismiss(None)
