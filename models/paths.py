"""The two pathlib calls on a user's path that raise a bare RuntimeError instead of an OSError.

``Path.expanduser`` raises one for a ``~user`` that does not exist (or no home folder), and on Python
before 3.13 ``Path.resolve`` raises one for a symbolic-link loop. Either would reach the user as a
traceback; every caller in ``models`` goes through here to get a one-line CheckpointError instead.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from .errors import CheckpointError

LINK_LOOP = os.strerror(errno.ELOOP)  # "Too many levels of symbolic links", as open() says it


def expand_user(path: Path | str, label: str) -> Path:
    """``path`` with ``~`` expanded; ``label`` names what it is (a flag, a variable) in the error."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        raise CheckpointError(f"{label}: cannot expand {str(path).split(os.sep)[0]} (no such user "
                              "or no home folder)") from None


def resolve(path: Path, label: str) -> Path:
    """``path`` with every link followed; a link loop (RuntimeError before Python 3.13, OSError after) is said
    as open() would say it, ``label`` naming the file."""
    try:
        return path.resolve()
    except (RuntimeError, OSError) as err:
        reason = LINK_LOOP if isinstance(err, RuntimeError) else (err.strerror or str(err))
        raise CheckpointError(f"{label}: {reason}") from None
