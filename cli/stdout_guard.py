"""Standard output that cannot be written: a closed pipe ends quietly, a full disk is one line.

Why: ``graphtop trace summary T | head -1`` and ``graphtop advise T > /dev/full`` ended in a Python
traceback (exit 1). By then every file the command was asked to write is written (output and trace go
before the summary), so nothing is lost: only the report to the terminal could not be given. Only a
failure of standard output itself is caught: the CLI's stdout is wrapped so its errors carry that name.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Any, Iterator, TextIO


class StdoutError(OSError):
    """Writing or flushing standard output failed (``broken_pipe``: its reader went away)."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror)
        self.broken_pipe = isinstance(cause, BrokenPipeError)


class GuardedStdout:
    """``sys.stdout`` as it was, with its write errors raised as :class:`StdoutError`."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            raise StdoutError(exc) from exc

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            raise StdoutError(exc) from exc

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding ... as the stream has them
        return getattr(self._stream, name)


@contextmanager
def guarded_stdout() -> Iterator[None]:
    original = sys.stdout
    guard = GuardedStdout(original)
    sys.stdout = guard  # type: ignore[assignment]
    try:
        yield
    finally:
        if sys.stdout is guard:
            sys.stdout = original


def stdout_error_line(exc: StdoutError) -> str:
    """What to print on stderr: nothing for a reader that left (``| head``), else one line."""
    return "" if exc.broken_pipe else f"cannot write to standard output: {exc.strerror or exc}"


def silence_stdout() -> None:
    """Point standard output at /dev/null, so the interpreter's flush at exit does not fail again with
    'Exception ignored ... BrokenPipeError' on stderr."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError, AttributeError):  # no descriptor behind it (captured in a test)
        pass
