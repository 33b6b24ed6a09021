"""A one-field dialog asking for a file path (export trace, open trace, screenshot).

Works the way a Textual dialog should: the field has the focus when it opens (``AUTO_FOCUS``; the
app itself starts with no focus so single keys work), Enter confirms, Escape cancels, and the hint
says both, under whatever the caller wants to say (how many events, which folder).
"""

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

    AUTO_FOCUS = "Input"
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="path.cancel", tooltip="Close without doing anything")]

    def __init__(self, title: str, value: str = "", detail: str = "", *, verb: str = "confirms") -> None:
        """``detail``: a line about the operation (shown above the key hint); ``verb``: what Enter
        does (``"exports"``, ``"opens"``, ``"saves"``)."""
        super().__init__()
        self.title_text = title
        self.value = value
        self.detail = detail
        self.verb = verb

    def compose(self) -> ComposeResult:
        with Vertical(id="path-box", classes="modal-box"):
            yield Label(self.title_text, classes="modal-title")
            yield Input(self.value, id="path-input", select_on_focus=False)
            if self.detail:
                yield Label(self.detail, id="path-detail", classes="modal-detail")
            yield Label(f"enter {self.verb} · escape cancels", id="path-hint", classes="modal-hint")

    @on(Input.Submitted)
    def _submit(self, event: Input.Submitted) -> None:
        event.stop()
        value = event.value.strip()
        self.dismiss(value or None)

    def action_cancel(self) -> None:
        self.dismiss(None)
