"""Write the events the dashboard has seen as a trace that ``graphtop replay`` can open.

Uses the recorder's own line encoder so exported traces and recorded traces are the same format.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, BinaryIO, Iterable, Optional

if TYPE_CHECKING:
    from graphtop.engine.telemetry.events import Event


def export_trace(path: str, events: Iterable[Event], meta: Optional[dict] = None,
                 source: Optional[str] = None) -> int:
    """Header line + one line per event; returns the number of events written.

    Written through ``safe_write.write_atomic`` (temporary file + rename, the target's mode kept,
    links never replaced), so a failed export never leaves a half trace behind. ``source`` is the
    trace being replayed, if any: exporting over it is refused (the replay may not have read it all).
    Raises ``OSError`` or ``OutputPathError`` (one line).
    """
    from graphtop.engine.telemetry.events import TraceHeader
    from graphtop.engine.telemetry.recorder import encode_event
    from graphtop.engine.telemetry.safe_write import check_distinct, write_atomic

    check_distinct([("export", path)], [("the open trace", source)])
    count = [0]

    def write(f: BinaryIO) -> None:
        f.write(encode_event(TraceHeader(meta=dict(meta or {}))))
        for ev in events:
            if ev.type == TraceHeader.type:
                continue
            f.write(encode_event(ev))
            count[0] += 1

    write_atomic(path, write, "export")
    return count[0]
