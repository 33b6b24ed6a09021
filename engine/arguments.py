"""Argument checks every boundary shares: how a bad value is quoted, what a wait's ``timeout`` may be, and
whether text is valid Unicode.

Its own dependency-free module (no torch, no other engine module) because every boundary check quotes
values (graph config, sampling parameters, trace lines, CLI flags) and telemetry (no torch) and the
engine both wait, and those live in packages that must not import each other. The quoting rule itself
lives at the bottom, in ``graphtop.models.text``, which the models' checks share; this module is the
engine's one door to it (the import-linter contracts let no other engine module reach into models for it).
"""

from __future__ import annotations

import math
from typing import Any, Optional

from graphtop.models.text import short_repr, short_text

__all__ = ["is_unicode", "short_repr", "short_text", "wait_timeout"]


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
