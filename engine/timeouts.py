"""The one policy for a ``timeout`` that a public wait takes (``Subscription.get``, ``RequestHandle.wait``,
``Engine.wait_for_capture``).

Its own dependency-free module because telemetry (no torch) and the engine both wait, and the values
Python's own waits mishandle must be refused the same way everywhere: ``threading`` raises
OverflowError for ``inf`` and a NaN deadline never passes, so a loop that re-waits spins at 100 % CPU.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from .short_repr import short_repr


def wait_timeout(timeout: Any, what: str) -> Optional[float]:
    """``timeout`` as a wait takes it: None or ``inf`` is None (wait forever); a number <= 0 stays (the
    caller's "do not wait"); NaN is a ValueError and a non-number a TypeError, each one line."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"{what}: timeout must be a number of seconds or None, got {short_repr(timeout)}")
    if math.isnan(timeout):
        raise ValueError(f"{what}: timeout must be a number of seconds or None, got nan")
    if timeout == math.inf:
        return None
    return float(timeout)
