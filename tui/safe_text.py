"""Text from outside the UI (model output, prompts, paths, engine and remote messages) made safe to draw.

Why: Textual writes a widget's characters to the terminal as they are. It drops BEL, backspace, VT, FF
and CR, but ESC, NUL and the C1 controls pass through, so a completion or a remote engine's message
holding ``\\x1b]0;title\\x07`` could retitle the window or restyle the screen. The stand-ins are
``graphtop.engine.telemetry.plain_text``'s (one for one, so a :class:`Content`'s style spans keep their
offsets).
Markup is the other half: outside text is never parsed as Textual markup (``GraphtopApp.notify``,
:func:`literal`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphtop.engine.telemetry.plain_text import error_line, field_text, json_escaped, one_line, printable

__all__ = ["error_line", "field_text", "json_escaped", "literal", "one_line", "printable", "safe_content"]

if TYPE_CHECKING:  # importing this module loads no Textual: its plain-text functions serve headless code too
    from textual.content import Content


def safe_content(content: Content) -> Content:
    """``content`` with :func:`printable` applied to its text, its spans unchanged."""
    from textual.content import Content

    plain = content.plain
    safe = printable(plain)
    return content if safe is plain else Content(safe, list(content.spans))


def literal(text: str) -> Content:
    """``text`` as content to show as it is: no markup, controls as stand-ins."""
    from textual.content import Content

    return Content(printable(text))
