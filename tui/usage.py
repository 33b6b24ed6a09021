"""The CLI's error for bad input from the user: printed as ``graphtop: error: ...`` (one line), exit 2.

Its own module so every part of the CLI (argument parsing, headless runs, trace tools, the launchers)
can raise it, or print an error in the same form, without importing the entry point that catches it.
"""

import re
import sys

from .safe_text import printable

MAX_MESSAGE_CHARS = 400


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


def one_line(message: str) -> str:
    """A message as the CLI prints it: one line, no terminal controls (it may quote a remote engine, a
    file or an exception), and short even when it quotes a huge input."""
    message = printable(re.sub(r"\s*[\r\n]+\s*", " ", message).strip())
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    half = MAX_MESSAGE_CHARS // 2 - 2
    return f"{message[:half]} … {message[-half:]}"


def error_line(message: object) -> str:
    """Every error the CLI prints has this one form."""
    return f"graphtop: error: {one_line(str(message))}"


def print_error(message: str) -> None:
    print(error_line(message), file=sys.stderr)
