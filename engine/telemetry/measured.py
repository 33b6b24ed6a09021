"""Which values of an event are measurements: the one check the live fold applies before it counts.

Events from an attached engine are decoded by type only (a buggy or hostile engine can send NaN,
infinities or negative timings), and a trace read from disk has passed ``value_limits`` already. A
value that is no measurement is left out of every sample and sum the fold keeps: one NaN in a chart's
data crashes Textual's ``Sparkline`` (``int(nan)``), and an infinity poisons every mean and percentile.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from .events import StepEvent
from .value_limits import MAX_FLOAT

__all__ = ["finite_step", "measured"]


def measured(value: Any) -> Optional[float]:
    """``value`` if it is a number a trace may hold (finite, 0..2**53: ``value_limits``), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if 0.0 <= value <= MAX_FLOAT else None  # also False for NaN


def finite_step(ev: StepEvent) -> StepEvent:
    """``ev`` with its timings and padding share made displayable (see ``measured``): an optional one
    that is no measurement becomes None (the table shows "—", the charts skip it), a required one 0.0
    (neutral in the sums the tallies and the what-if make; None there would break their arithmetic)."""
    r, g, b = ev.replay_ms, ev.segment_ms, ev.break_ms
    try:  # every step is folded: the usual all-valid step costs these comparisons only
        if (
            0.0 <= ev.host_ms <= MAX_FLOAT
            and 0.0 <= ev.padding_waste <= MAX_FLOAT
            and (r is None or 0.0 <= r <= MAX_FLOAT)
            and (g is None or 0.0 <= g <= MAX_FLOAT)
            and (b is None or 0.0 <= b <= MAX_FLOAT)
        ):
            return ev
    except TypeError:  # not a number at all: the checks below say which
        pass
    fixes: dict[str, Optional[float]] = {}
    for name in ("replay_ms", "segment_ms", "break_ms"):
        value = getattr(ev, name)
        if value is not None and measured(value) is None:
            fixes[name] = None
    for name in ("host_ms", "padding_waste"):
        if measured(getattr(ev, name)) is None:
            fixes[name] = 0.0
    return dataclasses.replace(ev, **fixes) if fixes else ev
