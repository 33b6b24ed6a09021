"""The CLI's error for bad input from the user: printed as ``graphtop: error: ...`` (one line), exit 2.

Its own module so every part of the CLI (argument parsing, headless runs, trace tools) can raise it
without importing the entry point that catches it.
"""


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""
