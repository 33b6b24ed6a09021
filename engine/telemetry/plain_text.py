"""Text from outside (a client's bytes, a path, an exception, a model's output) made safe to print or show.

Why: a terminal acts on control characters: ESC, NUL and the C1 controls can retitle a window or restyle
the screen, and a newline lets whoever wrote the text add whole lines to a log or an error. The Unicode
bidirectional controls make a terminal or an editor that applies the bidi algorithm show the text around
them in another order ("Trojan Source": a right-to-left override turns ``exe.txt`` into ``txt.exe`` on
screen), so a quoted name or message can read as something it is not. Lone surrogates cannot be encoded
at all. Each such character becomes one visible stand-in (a control picture such as ␛ for ESC, or
U+FFFD), one for one, so offsets into the text (a styled span) still hold.

This is the one rule for every text report: the engine's endpoint and the CLI use :func:`one_line` (trace
summary, advise, ps), the dashboard builds on :func:`printable`, every error graphtop prints is one
:func:`error_line` (the CLI's and the dashboard's alike), and JSON written where a terminal may show it
escapes the same characters (:func:`json_escaped`).
"""

from __future__ import annotations

import re

MAX_MESSAGE_CHARS = 400
"""The longest message an :func:`error_line` quotes whole; a longer one keeps its head and its tail."""

BIDI_CONTROLS = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
"""Unicode's bidirectional formatting characters, as a regular-expression class body: ALM, LRM, RLM, the
embeddings and overrides LRE RLE PDF LRO RLO, the isolates LRI RLI FSI PDI."""

_UNSAFE = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{BIDI_CONTROLS}\ud800-\udfff]")
"""C0 controls but tab and newline, DEL, C1 controls, bidi controls, lone surrogates."""


def _stand_in(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x20:
        return chr(0x2400 + code)  # ␀ … ␟ (␛ for ESC)
    if code == 0x7F:
        return "\u2421"  # ␡
    return "\ufffd"


def printable(text: str) -> str:
    """``text`` with every control character but tab and newline, and every bidi control, shown as a
    stand-in, same length."""
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


def json_escaped(json_text: str) -> str:
    """JSON text (``json.dumps(..., ensure_ascii=False)``) with the characters :func:`printable` stands in for
    written as ``\\uXXXX`` escapes: the same value for every JSON reader, and nothing a terminal acts on
    when the file is shown (``json`` itself escapes only C0 controls)."""
    if not _UNSAFE.search(json_text):
        return json_text
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", json_text)


def message_line(message: str) -> str:
    """A message as an error line quotes it: one line (the spaces around a line break fold into one), no
    terminal controls (it may quote a remote engine, a file or an exception), and short even when it
    quotes a huge input."""
    message = printable(re.sub(r"\s*[\r\n]+\s*", " ", message).strip())
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    half = MAX_MESSAGE_CHARS // 2 - 2
    return f"{message[:half]} … {message[-half:]}"


def error_line(message: object) -> str:
    """Every error graphtop prints has this one form: the CLI's, and the dashboard's when it exits on one."""
    return f"graphtop: error: {message_line(str(message))}"
