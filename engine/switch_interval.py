"""The interpreter's switch interval while another Python thread works beside the step thread.

CPython hands the GIL to a waiting thread when its holder blocks, or else once the switch interval has
passed (5 ms by default). The step thread releases the GIL at every torch call and kernel launch and must
take it back each time: with another thread busy in Python meanwhile (a parity check's re-run, the HTTP
server's event loop), each take-back can wait a whole interval, and a step that
takes it back a hundred times waits for far longer than it computes. Each such thread asks for an interval
of at most its bound while it works (``at_most``); the smallest bound asked for holds, and the interval
the process had comes back once the last ask ends, unless someone else set another one meanwhile.
"""

from __future__ import annotations

import itertools
import sys
import threading
from typing import Optional

_lock = threading.Lock()
_asks: dict[int, float] = {}
_ids = itertools.count()
_saved: Optional[float] = None  # the interval before the first ask
_set: Optional[float] = None  # the interval this module set last


def at_most(seconds: float) -> int:
    """Ask for a switch interval of at most ``seconds``; returns the ask's token for ``release``."""
    global _saved
    with _lock:
        token = next(_ids)
        if not _asks:
            _saved = sys.getswitchinterval()
        _asks[token] = seconds
        _apply()
        return token


def release(token: Optional[int]) -> None:
    """End an ask (None, or a token already released: nothing)."""
    global _saved, _set
    if token is None:
        return
    with _lock:
        if _asks.pop(token, None) is None:
            return
        if _asks:
            _apply()
            return
        if _saved is not None and _set is not None and abs(sys.getswitchinterval() - _set) < 1e-12:
            sys.setswitchinterval(_saved)  # unless someone else changed it since
        _saved = _set = None


def _apply() -> None:
    global _set
    want = min(min(_asks.values()), _saved if _saved is not None else float("inf"))
    if _set is not None and abs(sys.getswitchinterval() - _set) > 1e-12:
        want = min(want, sys.getswitchinterval())  # someone else set a shorter one since: keep theirs
    sys.setswitchinterval(want)
    _set = sys.getswitchinterval()
