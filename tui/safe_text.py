"""Text from outside the UI (model output, prompts, paths, engine and remote messages) made safe to draw.

Why: Textual writes a widget's characters to the terminal as they are. It drops BEL, backspace, VT, FF
and CR, but ESC, NUL and the C1 controls pass through, so a completion or a remote engine's message
holding ``\\x1b]0;title\\x07`` could retitle the window or restyle the screen. Lone surrogates cannot be
encoded for the terminal at all. Each such character becomes one visible stand-in (a control picture
such as ␛ for ESC, or U+FFFD), one for one, so a :class:`Content`'s style spans keep their offsets.
Markup is the other half: outside text is never parsed as Textual markup (``GraphtopApp.notify``,
:func:`literal`).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI's error lines use printable() without loading Textual
    from textual.content import Content

_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
"""C0 controls but tab and newline, DEL, C1 controls, lone surrogates."""


def _stand_in(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x20:
        return chr(0x2400 + code)  # ␀ … ␟ (␛ for ESC)
    if code == 0x7F:
        return "\u2421"  # ␡
    return "\ufffd"


def printable(text: str) -> str:
    """``text`` with every control character but tab and newline shown as a stand-in, same length."""
    if not _UNSAFE.search(text):
        return text
    return _UNSAFE.sub(_stand_in, text)


def one_line(text: str) -> str:
    """``text`` printable on one line: line breaks become spaces (a CLI error is one line)."""
    return printable(" ".join(text.splitlines()) if "\n" in text or "\r" in text else text)


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
