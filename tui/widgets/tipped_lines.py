"""A text widget whose tooltip explains the line under the mouse.

Panels list reasons and ledger rows as lines of one ``Static`` (cheap to redraw); a widget per line
only for its tooltip would cost a DOM node each. Here the lines carry their tooltips alongside, and
moving the mouse picks the one under it.
"""

from __future__ import annotations

from typing import Optional, Sequence

from textual import events
from textual.content import Content
from textual.widgets import Static

from ..safe_text import literal
from .panel import set_content


class TippedLines(Static):
    """Lines of text, each with an optional tooltip."""

    def __init__(self, *, id: Optional[str] = None, classes: Optional[str] = None) -> None:
        super().__init__(id=id, classes=classes)
        self.tips: tuple[Optional[str], ...] = ()

    def show(self, lines: Sequence[Content], tips: Sequence[Optional[str]] = ()) -> bool:
        """Show ``lines``; ``tips[i]`` explains line ``i`` (missing or None: no tooltip there)."""
        self.tips = tuple(tips)
        return set_content(self, Content("\n").join(lines))

    def tip_at(self, line: int) -> Optional[str]:
        return self.tips[line] if 0 <= line < len(self.tips) else None

    def on_mouse_move(self, event: events.MouseMove) -> None:
        tip = self.tip_at(event.y)
        self.tooltip = None if tip is None else literal(tip)
