"""A user's path made safe to use: the two pathlib calls that raise a bare RuntimeError instead of an
OSError, and names the Rust readers cannot open.

``Path.expanduser`` raises one for a ``~user`` that does not exist (or no home folder), and on Python
before 3.13 ``Path.resolve`` raises one for a symbolic-link loop. Either would reach the user as a
traceback; every caller in ``models`` goes through here to get a one-line CheckpointError instead.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from ..errors import CheckpointError

LINK_LOOP = os.strerror(errno.ELOOP)  # "Too many levels of symbolic links", as open() says it


def expand_user(path: Path | str, label: str) -> Path:
    """``path`` with ``~`` expanded; ``label`` names what it is (a flag, a variable) in the error."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        raise CheckpointError(
            f"{label}: cannot expand {str(path).split(os.sep)[0]} (no such user or no home folder)"
        ) from None


def resolve(path: Path, label: str) -> Path:
    """``path`` with every link followed; a link loop (RuntimeError before Python 3.13, OSError after) is said
    as open() would say it, ``label`` naming the file."""
    try:
        return path.resolve()
    except (RuntimeError, OSError) as err:
        reason = LINK_LOOP if isinstance(err, RuntimeError) else (err.strerror or str(err))
        raise CheckpointError(f"{label}: {reason}") from None


def utf8_path(path: Path, label: str) -> Path:
    """``path``, refused when it is not valid UTF-8 (a raw byte in a file name, as Python decodes it):
    safetensors and tokenizers open only UTF-8 paths, and the weights were then called "corrupt or
    truncated" while the file was fine."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        shown = str(path).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        raise CheckpointError(
            f"{label} {shown} is not valid UTF-8, and the safetensors and tokenizers readers "
            "open only UTF-8 paths: rename it"
        ) from None
    return path
