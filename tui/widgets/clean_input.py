"""The dashboard's one-line input field: control characters never get into it.

Why: Textual's ``Input`` takes a paste (and any text set on it) as it is, and draws it raw: a pasted
``ESC ] 0 ; … BEL`` retitled the window, ESC [ 2 J cleared the screen, and a NUL or C1 went on to the
engine inside a prompt or into a bucket editor's error line. Every input in ``tui/`` is a
:class:`CleanInput` (or a subclass), so the rule (``safe_text.field_text``) is applied in one place.

A paste of several lines is kept whole, its lines joined by a space: Textual keeps only the first line,
so a pasted multi-line prompt was cut short without a word (the field is one line, and a bucket list
takes a space as a separator).
"""

from __future__ import annotations

from textual import events
from textual.widgets import Input

from ..safe_text import field_text


class CleanInput(Input):
    """An ``Input`` whose text is ``field_text``: controls dropped, tabs and line breaks as spaces."""

    def replace(self, text: str, start: int, end: int) -> None:
        """Typing and pasting come through here: clean first, so the cursor lands after what was kept."""
        super().replace(field_text(text), start, end)

    def _on_paste(self, event: events.Paste) -> None:
        """Textual's own paste keeps the first line only: this one takes the whole text, on one line
        (``prevent_default``: Textual runs each class's handler, and the base one would paste again)."""
        event.prevent_default()
        event.stop()
        text = " ".join(event.text.splitlines())
        if text:
            if self.selection.is_empty:
                self.insert_text_at_cursor(text)
            else:
                self.replace(text, *self.selection)

    def validate_value(self, value: str) -> str:
        """Text set directly (a recalled history entry, a prefilled value) is held to the same rule."""
        return field_text(value)
