"""What kind of file a path names when it is not a plain file: a FIFO, a socket or a device.

Why: the dashboard reads and writes on its UI thread (open trace) or a worker it waits for at exit
(export trace), and opening a FIFO blocks until the other end opens it: one typed path froze the whole
dashboard, or left a thread that kept the process from exiting. The CLI reads and writes FIFOs by
design (``--replay``, ``--record``); the dashboard's dialogs refuse them, naming the kind.
"""

from __future__ import annotations

import os
import stat
from typing import Optional, Union

PathLike = Union[str, "os.PathLike[str]"]

_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a Unix socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def special_kind(path: PathLike) -> Optional[str]:
    """``"a FIFO"``, ``"a Unix socket"``, ``"a character device"`` or ``"a block device"`` for what
    ``path`` names (a link followed); None for a regular file, a folder or nothing at all."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None  # missing or unreadable: the open that follows says why, in its own words
    for test, kind in _KINDS:
        if test(mode):
            return kind
    return None


def is_fifo(path: PathLike) -> bool:
    """True when ``path`` names a FIFO (a link followed): opening it blocks until the other end opens."""
    return special_kind(path) == "a FIFO"
