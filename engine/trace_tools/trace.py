"""Reads JSON-lines trace files written by ``TraceRecorder`` or ``write_trace`` (trace_writer.py).

Strict about everything except the one damage a killed recorder can cause: a final line cut off
before its newline. That line is skipped and ``truncated_tail`` is set, so traces of crashed or
SIGKILLed runs stay usable. Any other problem raises ``TraceError`` as ``path:LINE: message``, which
the CLI prints as is.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterator, Union

from ..telemetry.events import SCHEMA_VERSION, Event, TraceHeader, event_from_dict, validate_event_dict
from ..telemetry.trace_writer import NonFinite, refuse_constant
from ..telemetry.value_limits import MAX_DEPTH, SchemaError, short_repr

__all__ = ["Trace", "TraceError", "TraceDicts", "iter_trace_dicts", "read_trace"]

PathLike = Union[str, "os.PathLike[str]"]


class TraceError(ValueError):
    """A trace file cannot be read; the message is ``path:LINE: what is wrong`` (one line)."""


@dataclass
class Trace:
    """A parsed trace: the header and every complete event after it, in file order."""

    path: str
    header: TraceHeader
    events: list[Event] = field(default_factory=list)
    truncated_tail: bool = False  # the final line was cut off (killed writer) and skipped

    @property
    def schema_version(self) -> int:
        return self.header.schema_version

    @property
    def meta(self) -> dict:
        return self.header.meta


class TraceDicts:
    """Iterator over a trace's lines as validated dicts, header first.

    ``truncated_tail`` becomes meaningful once iteration is exhausted. Streaming consumers (a
    dashboard replaying a large trace) use this instead of ``read_trace`` to avoid holding every
    event in memory.
    """

    def __init__(self, path: PathLike) -> None:
        self.path = str(path)
        self.truncated_tail = False
        self._gen = self._iterate()

    def __iter__(self) -> "TraceDicts":
        return self

    def __next__(self) -> dict[str, Any]:
        return next(self._gen)

    def _error(self, lineno: int, message: str) -> TraceError:
        return TraceError(f"{self.path}:{lineno}: {message}")

    def _iterate(self) -> Iterator[dict[str, Any]]:
        try:
            f = open(self.path, "rb")
        except OSError as exc:
            raise TraceError(f"{self.path}: cannot read trace: {exc.strerror or exc}") from None
        with f:
            seen_header = False
            lineno = 0
            while raw := f.readline(MAX_LINE_BYTES + 1):
                lineno += 1
                complete = raw.endswith(b"\n")
                if len(raw) > MAX_LINE_BYTES and not complete:
                    raise self._error(lineno, f"line longer than {MAX_LINE_BYTES >> 20} MiB (not a trace?)")
                if not raw.strip():
                    continue
                obj = self._parse(raw, lineno, complete)
                if obj is _TRUNCATED:
                    self.truncated_tail = True
                    break
                if not seen_header:
                    self._check_header(obj, lineno)
                    seen_header = True
                elif not isinstance(obj, dict):
                    raise self._error(
                        lineno, f"an event line must be a JSON object, got a JSON {_json_kind(obj)} (not a JSON object)"
                    )
                elif obj.get("type") == TraceHeader.type:
                    raise self._error(lineno, "unexpected second trace header (concatenated traces?)")
                else:
                    try:
                        validate_event_dict(obj)
                    except SchemaError as exc:
                        raise self._error(lineno, f"schema violation: {exc}") from None
                yield obj
            if not seen_header:
                what = "header line is truncated" if self.truncated_tail else "empty trace: no header line"
                raise self._error(max(lineno, 1), what)

    def _parse(self, raw: bytes, lineno: int, complete: bool) -> Any:
        """Parse one line; _TRUNCATED means 'truncated final line' (no newline and not valid JSON)."""
        if raw.count(b"[") + raw.count(b"{") > 2 * MAX_DEPTH and _depth(raw) > MAX_DEPTH:
            raise self._error(lineno, f"nested deeper than {MAX_DEPTH} levels")
        try:
            return json.loads(raw, parse_constant=refuse_constant)
        except UnicodeDecodeError as exc:
            if not complete:
                return _TRUNCATED
            raise self._error(lineno, f"not UTF-8: {exc.reason}") from None
        except json.JSONDecodeError as exc:
            if not complete:
                return _TRUNCATED  # only the last line can lack a newline
            raise self._error(lineno, f"bad JSON: {exc.msg} (column {exc.colno})") from None
        except NonFinite as exc:
            raise self._error(lineno, f"non-finite number {exc.args[0]} (traces hold finite numbers only)") from None
        except ValueError as exc:  # an integer of more than 4300 digits (int-from-string limit)
            raise self._error(lineno, f"number out of range ({str(exc).splitlines()[0][:80]})") from None
        except RecursionError:
            raise self._error(lineno, f"nested deeper than {MAX_DEPTH} levels") from None

    def _check_header(self, obj: Any, lineno: int) -> None:
        if not isinstance(obj, dict) or obj.get("type") != TraceHeader.type:
            got = short_repr(obj.get("type")) if isinstance(obj, dict) else f"a JSON {_json_kind(obj)}"
            raise self._error(lineno, f"first line is not a trace header (got type {got})")
        version = obj.get("schema_version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise self._error(lineno, f"bad header: schema_version should be int, got {short_repr(version)}")
        if version < 1:  # versions start at 1: a 0 or a negative one was written by no graphtop
            raise self._error(lineno, f"bad header: schema_version should be 1 or more, got {short_repr(version)}")
        if version > SCHEMA_VERSION:
            raise self._error(
                lineno,
                f"trace schema_version {version} is newer than this graphtop supports ({SCHEMA_VERSION})",
            )
        try:
            validate_event_dict(obj)
        except SchemaError as exc:
            raise self._error(lineno, f"bad header: {exc}") from None


#: A trace line is one event (a few hundred bytes; the header's meta a little more): a longer one is not
#: a trace, and reading it whole (a device with no newline, such as /dev/zero) would never end.
MAX_LINE_BYTES = 64 << 20

_TRUNCATED = object()  # _parse's answer for a cut-off final line (a line can hold JSON null)


def _depth(raw: bytes) -> int:
    """Deepest bracket nesting outside strings; only called for lines with many brackets."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def _json_kind(obj: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(obj), "number")


def iter_trace_dicts(path: PathLike) -> TraceDicts:
    """Iterate a trace's lines as validated dicts (header first); see ``TraceDicts``."""
    return TraceDicts(path)


def read_trace(path: PathLike) -> Trace:
    """Read a whole trace into event objects. Raises ``TraceError`` (``path:LINE: message``)."""
    lines = TraceDicts(path)
    header: TraceHeader | None = None
    events: list[Event] = []
    for obj in lines:
        event = event_from_dict(obj)
        if header is None:
            assert isinstance(event, TraceHeader)
            header = event
        else:
            events.append(event)
    assert header is not None  # TraceDicts raises on a trace without header
    return Trace(path=str(path), header=header, events=events, truncated_tail=lines.truncated_tail)
