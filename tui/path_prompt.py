"""A one-field modal asking for a file path (export trace / open trace)."""

from __future__ import annotations

from typing import Optional

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label


class PathPromptScreen(ModalScreen[Optional[str]]):
    """Returns the entered path, or None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="path.cancel", tooltip="Close without doing anything")]

    def __init__(self, title: str, value: str = "", hint: str = "") -> None:
        super().__init__()
        self.title_text = title
        self.value = value
        self.hint = hint

    def compose(self) -> ComposeResult:
        with Vertical(id="path-box", classes="modal-box"):
            yield Label(self.title_text, classes="modal-title")
            yield Input(self.value, id="path-input")
            yield Label(self.hint or "enter confirms · escape cancels", classes="modal-hint")

    @on(Input.Submitted)
    def _submit(self, event: Input.Submitted) -> None:
        event.stop()
        value = event.value.strip()
        self.dismiss(value or None)

    def action_cancel(self) -> None:
        self.dismiss(None)
