"""The CLI's error for bad input from the user: printed as ``graphtop: error: ...`` (one line), exit 2.

Its own module so every part of the CLI (argument parsing, headless runs, trace tools, the launchers)
can raise it, or print an error in the same form, without importing the entry point that catches it.
"""

import sys

from .safe_text import one_line


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


def error_line(message: str) -> str:
    """Every error the CLI prints has this one form: one line, no terminal controls (the message may
    quote a remote engine, a file or an exception)."""
    return f"graphtop: error: {one_line(str(message))}"


def print_error(message: str) -> None:
    print(error_line(message), file=sys.stderr)
