"""An Input with shell-like history on up/down (the draft you were typing is kept)."""

from __future__ import annotations

from collections import deque

from textual.binding import Binding

from .clean_input import CleanInput

HISTORY = 200


class HistoryInput(CleanInput):
    """Remembers submitted values; up/down walk them like a shell."""

    BINDINGS = [
        Binding(
            "up",
            "history(-1)",
            "Previous prompt",
            show=False,
            id="prompt.history_prev",
            tooltip="Recall the previous prompt",
        ),
        Binding(
            "down",
            "history(1)",
            "Next prompt",
            show=False,
            id="prompt.history_next",
            tooltip="Recall the next prompt (or your draft)",
        ),
    ]

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.history: deque[str] = deque(maxlen=HISTORY)
        self._index: int | None = None  # None = editing the draft
        self._draft = ""

    def remember(self, value: str) -> None:
        """Add a submitted value (consecutive duplicates are kept once)."""
        if value and (not self.history or self.history[-1] != value):
            self.history.append(value)
        self._index = None
        self._draft = ""

    def action_history(self, direction: int) -> None:
        if not self.history:
            return
        if self._index is None:
            if direction > 0:
                return
            self._draft = self.value
            self._index = len(self.history) - 1
        else:
            self._index += direction
        if self._index < 0:
            self._index = 0
        if self._index >= len(self.history):
            self._index = None
            self.value = self._draft
        else:
            self.value = self.history[self._index]
        self.cursor_position = len(self.value)
