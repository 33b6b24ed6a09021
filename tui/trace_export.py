"""Write the events the dashboard has seen as a trace that ``graphtop replay`` can open.

Uses the trace codec the recorder uses so exported traces and recorded traces are the same format.
"""

from __future__ import annotations

import os
from typing import Iterable, Optional

from graphtop.engine.telemetry.codec import encode_event
from graphtop.engine.telemetry.events import Event, TraceHeader


def export_trace(path: str, events: Iterable[Event], meta: Optional[dict] = None) -> int:
    """Header line + one line per event; returns the number of events written.

    Written to ``path.tmp`` and renamed, so a failed export never leaves a half trace behind.
    """
    tmp = f"{path}.tmp"
    n = 0
    with open(tmp, "wb") as f:
        f.write(encode_event(TraceHeader(meta=dict(meta or {}))))
        for ev in events:
            if ev.type == TraceHeader.type:
                continue
            f.write(encode_event(ev))
            n += 1
    os.replace(tmp, path)
    return n
