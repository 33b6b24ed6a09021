"""The CLI's error for bad input from the user: printed as ``graphtop: error: ...`` (one line), exit 2.

Its own module so every part of the CLI (argument parsing, headless runs, trace tools, the launchers)
can raise it, or print an error in the same form, without importing the entry point that catches it.
The form itself, :func:`error_line`, is ``graphtop.engine.telemetry.plain_text``'s: the dashboard exits
with it too.
"""

import sys

from graphtop.engine.telemetry.plain_text import error_line

__all__ = ["UsageError", "error_line", "print_error"]


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


def print_error(message: str) -> None:
    print(error_line(message), file=sys.stderr)
