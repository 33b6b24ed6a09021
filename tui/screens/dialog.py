"""The base of graphtop's dialogs: they leave the dashboard's status line and footer row in view.

A dialog on a 24-row terminal filled the whole height and hid the status line, the one place that
says what the engine is doing. Each dialog gets a hidden row docked at the top and one at the bottom
(``.modal-margin`` in modals.tcss): its box is centred in what is left, and the dashboard shows
through those rows. Padding on the screen would do the same but shifts the dashboard drawn behind.
"""

from __future__ import annotations

from typing import TypeVar

from textual.screen import ModalScreen
from textual.widgets import Static

ResultType = TypeVar("ResultType")


class Dialog(ModalScreen[ResultType]):
    """A modal screen whose box keeps clear of the first and the last row of the terminal."""

    def on_mount(self) -> None:
        self.mount(Static(classes="modal-margin"), Static(classes="modal-margin -bottom"))
