"""Argument checks every boundary shares: how a bad value is quoted, what a wait's ``timeout`` may be, and
whether text is valid Unicode.

Its own dependency-free module (no torch, no other engine module) because every boundary check quotes
values (graph config, sampling parameters, trace lines, CLI flags) and telemetry (no torch) and the
engine both wait, and those live in packages that must not import each other.
"""

from __future__ import annotations

import math
from typing import Any, Optional

LIMIT = 40
"""Longest quoted value or token in a message, in characters."""


def short_text(text: str) -> str:
    """Text as a message quotes it: whole when short, cut when someone pasted a megabyte."""
    return text if len(text) <= LIMIT else text[: LIMIT - 3] + "..."


def short_repr(v: Any) -> str:
    """A bad value as a one-line message shows it (a 5000-digit int is described, not printed)."""
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 128:
        return f"an integer of {v.bit_length()} bits"
    return short_text(repr(v))


def is_unicode(text: str) -> bool:
    """False for a str holding a lone surrogate (legal in a JSON escape or a surrogate-escaped argv or
    path, not encodable as UTF-8): the one test the trace reader, the stop strings and the request ids
    apply to text."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def wait_timeout(timeout: Any, what: str) -> Optional[float]:
    """``timeout`` as a public wait takes it (``Subscription.get``, ``RequestHandle.wait``,
    ``Engine.wait_for_capture``): None or ``inf`` is None (wait forever); a number <= 0 stays (the
    caller's "do not wait"); NaN is a ValueError and a non-number a TypeError, each one line.

    The one policy for every wait, because the values Python's own waits mishandle must be refused the
    same way everywhere: ``threading`` raises OverflowError for ``inf`` and a NaN deadline never passes,
    so a loop that re-waits spins at 100 % CPU."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"{what}: timeout must be a number of seconds or None, got {short_repr(timeout)}")
    if math.isnan(timeout):
        raise ValueError(f"{what}: timeout must be a number of seconds or None, got nan")
    if timeout == math.inf:
        return None
    return float(timeout)
