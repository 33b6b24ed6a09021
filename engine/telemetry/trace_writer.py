"""Writing a whole trace file (``write_trace``), and the rule a written line must pass: the one the trace
reader (engine/trace_tools/trace.py) applies.

Live: the endpoint's export command and the dashboard's "export trace" write what they hold while the
engine runs, so this lives with the recorder, apart from the offline trace tools that read traces back.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, BinaryIO, Iterable, Optional, Union

from .codec import encode_event
from .events import Event, TraceHeader, validate_event_dict
from .value_limits import SchemaError, readable_free

__all__ = ["NonFinite", "readable_line", "refuse_constant", "write_trace"]

PathLike = Union[str, "os.PathLike[str]"]


class NonFinite(ValueError):
    """A NaN or an infinity in a line: strict JSON (and every trace) has none."""


def refuse_constant(name: str) -> Any:
    """json's hook for NaN, Infinity and -Infinity, which strict JSON (and every trace) lacks."""
    raise NonFinite(name)


def readable_line(line: bytes) -> bool:
    """``read_trace`` would take this event line: parsed and validated by the reader's own rules
    (``refuse_constant``, ``validate_event_dict``: finite numbers within the schema's limits)."""
    try:
        validate_event_dict(json.loads(line, parse_constant=refuse_constant))
    except (NonFinite, SchemaError, ValueError):
        return False
    return True


def write_trace(
    path: PathLike, events: Iterable[Event], meta: Optional[dict] = None, source: Optional[PathLike] = None
) -> int:
    """Header line + one line per event (the recorder's encoding); returns the number of events written.

    An event the reader would refuse (an attached engine's NaN timing, a number past the schema's
    limits) is left out, and the count logged: one such line makes ``read_trace`` refuse the whole file,
    so writing it would make an export that cannot be opened again. The rules are the reader's own.

    Written through ``safe_write.write_atomic`` (temporary file + rename, the target's mode kept, links
    never replaced), so a failed export never leaves a half trace behind. ``source`` is the trace being
    replayed, if any: exporting over it is refused (the replay may not have read it all). Used for the
    dashboard's "export trace" and the endpoint's export command. Raises ``OSError`` or
    ``OutputPathError`` (one line).
    """
    from .safe_write import check_distinct, write_atomic

    check_distinct([("export", path)], [("the open trace", source)])
    count = left_out = 0

    def write(f: BinaryIO) -> None:
        nonlocal count, left_out
        f.write(encode_event(TraceHeader(meta=readable_free(dict(meta or {})))))
        for ev in events:
            if ev.type == TraceHeader.type:
                continue
            line = encode_event(ev)
            if not readable_line(line):
                left_out += 1
                continue
            f.write(line)
            count += 1

    write_atomic(path, write, "export")
    if left_out:
        logging.getLogger("graphtop.trace").warning(
            "%s: left out %d event(s) the trace reader would refuse (a number that is not finite or past "
            "the schema's limits, or values that contradict each other)",
            path,
            left_out,
        )
    return count
