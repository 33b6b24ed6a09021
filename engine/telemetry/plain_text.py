"""Text from outside (a client's bytes, a path, an exception, a model's output) made safe to print or show.

Why: a terminal acts on control characters: ESC, NUL and the C1 controls can retitle a window or restyle
the screen, and a newline lets whoever wrote the text add whole lines to a log or an error. Lone
surrogates cannot be encoded at all. Each such character becomes one visible stand-in (a control
picture such as ␛ for ESC, or U+FFFD), one for one, so offsets into the text (a styled span) still hold.
The engine's endpoint and the CLI use :func:`one_line`; the dashboard builds on :func:`printable`.
"""

from __future__ import annotations

import re

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


def field_text(text: str) -> str:
    """``text`` fit for a one-line input field: the characters :func:`printable` would stand in for are
    dropped (a pasted ESC sequence must neither reach the terminal nor the engine, and a stand-in
    would be sent as text), and tabs and line breaks become spaces."""
    if "\t" in text or "\n" in text:
        text = text.replace("\t", " ").replace("\n", " ")
    return _UNSAFE.sub("", text) if _UNSAFE.search(text) else text


def one_line(text: str) -> str:
    """``text`` printable on one line: line breaks become spaces (an error or a log record is one line)."""
    return printable(" ".join(text.splitlines()) if "\n" in text or "\r" in text else text)
