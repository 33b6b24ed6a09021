"""Writes the event stream to a JSON-lines trace file from a background thread.

Crash safety: every write hands the OS only whole lines (a batch of complete ``...\\n`` lines in one
``write`` on an unbuffered file), so a SIGKILL can at worst leave a partially written *last* line,
never a damaged line in the middle; ``graphtop.engine.telemetry.trace.read_trace`` tolerates exactly that.

Failure isolation: the recorder must never take the engine down. The trace path is checked when the
recorder is constructed (so the CLI can exit 2 before loading a model); after that, a failing write
(ENOSPC, EIO, ...) stops recording, is remembered in ``write_error`` and reported by ``close()``,
while the engine keeps running.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import json.encoder
import operator
import os
import threading
import time
import types
import typing
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable, Optional, Union

from .bus import EventBus, Subscription
from .events import Event, TraceHeader, _jsonable, _type_hints
from .safe_write import OutputPathError, open_streaming

__all__ = ["RecorderError", "RecorderResult", "TraceRecorder", "encode_event"]

# Events per write() call at most. Small on purpose: encoding holds the GIL (~1-2 µs per event) and the
# write syscall releases it, so 64 events bound how long the engine thread can wait for the GIL to
# well under a millisecond, while still amortizing syscalls.
FLUSH_INTERVAL_S = 0.025  # a killed run loses at most this much of the trace's tail
_BATCH = 64


class RecorderError(Exception):
    """The trace file cannot be opened or its header written; the message is one line."""


def encode_event(event: Event) -> bytes:
    """One trace line: compact JSON of ``event.to_dict()`` plus a newline.

    ``default=str`` keeps a stray non-JSON value (only possible in ``Any``/``dict`` fields) from
    killing the recorder; such a value is written as its string form.

    Byte-for-byte the output of ``_encode_event_reference`` (the plain ``json`` path), ~4× faster:
    see ``_encode_line``.
    """
    return _encode_line(event).encode("utf-8")


_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str)


def _encode_event_reference(event: Event) -> bytes:
    """The specification of a trace line: what ``encode_event`` must produce, byte for byte."""
    return _reference_line(event).encode("utf-8")


def _reference_line(event: Event) -> str:
    return _ENCODER.encode(event.to_dict()) + "\n"


# -- fast encoding ----------------------------------------------------------------------------------
#
# The recorder thread encodes every event while holding the GIL the engine thread wants, so the
# per-event cost shows up directly in the engine's step time. Instead of building ``to_dict()`` and
# running the generic encoder over it, each event class gets a generated function (cached per class)
# that writes the constant ``{"type":"...","field":`` parts once and formats each field value with an
# exact-type dispatch matching what ``json`` (C encoder, ensure_ascii, allow_nan, compact separators)
# writes for that type. Anything the dispatch does not know exactly (containers, nested dataclasses,
# subclasses of str/int/float such as enums, arbitrary objects) is encoded on its own by the very
# encoder the reference uses, after the same ``_jsonable`` conversion ``to_dict`` applies, so the
# output stays identical for every value.

_enc_str = json.encoder.encode_basestring_ascii  # ensure_ascii=True: output is always ASCII


def _nonfinite(v: float) -> str:
    # json's allow_nan spellings; only reached for nan/inf (v - v != 0.0).
    if v != v:
        return "NaN"
    return "Infinity" if v > 0 else "-Infinity"


def _slow_value(v: Any) -> str:
    return _ENCODER.encode(_jsonable(v))


def _value(v: Any) -> str:
    """JSON text of one field value, exactly as the reference encoder writes it inside to_dict()."""
    t = type(v)
    if t is str:
        return _enc_str(v)
    if t is int:
        return f"{v!r}"  # int.__repr__, as json writes it (exact int only: bool/IntEnum differ)
    if t is float:
        return f"{v!r}" if v - v == 0.0 else _nonfinite(v)  # float.__repr__ for finite floats
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    return _slow_value(v)


# Inline fast checks per annotated type; every chain ends in the generic ``_value``, so an annotation
# only decides which check comes first, never what is written.
_INLINE: dict[Any, str] = {
    str: "if type(v) is str:\n        {a} = _enc_str(v)\n",
    int: "if type(v) is int:\n        {a} = f'{{v!r}}'\n",
    float: "if type(v) is float and v - v == 0.0:\n        {a} = f'{{v!r}}'\n",
    bool: "if v is True:\n        {a} = 'true'\n    elif v is False:\n        {a} = 'false'\n",
}

_UNIONS = (typing.Union, types.UnionType)  # Optional[X] and X | None


def _inline(annotation: Any) -> Optional[str]:
    try:
        return _INLINE.get(annotation)
    except TypeError:  # an unhashable annotation object
        return None


def _field_code(var: str, annotation: Any) -> str:
    checks: list[str] = []
    if typing.get_origin(annotation) in _UNIONS and type(None) in typing.get_args(annotation):
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(inner) == 1 and _inline(inner[0]):
            checks.append(_inline(inner[0]))  # type: ignore[arg-type]
        checks.append("if v is None:\n        {a} = 'null'\n")
    elif _inline(annotation):
        checks.append(_inline(annotation))  # type: ignore[arg-type]
    if not checks:
        return f"    {var} = _value(v)\n"
    code = "    " + "    el".join(checks) + "    else:\n        {a} = _value(v)\n"
    return code.format(a=var)


def _make_line_encoder(cls: type) -> Callable[[Any], str]:
    names = tuple(f.name for f in dataclasses.fields(cls))
    try:
        hints = _type_hints(cls)
    except Exception:  # unresolvable annotations only cost speed, never correctness
        hints = {}
    tag = cls.type  # type: ignore[attr-defined]
    if type(tag) is not str:
        return _reference_line
    # An instance whose ``type`` is not the class's (shadowed, or changed after this was generated)
    # takes the reference path.
    body: list[str] = ["def encode(ev):\n", "    if ev.type is not _tag:\n", "        return _reference(ev)\n",
                       "    d = ev.__dict__\n"]
    template = ["{", _enc_str("type"), ":", _enc_str(tag)]
    for i, name in enumerate(names):
        var = f"a{i}"
        body.append(f"    v = d[{name!r}]\n")
        body.append(_field_code(var, hints.get(name, Any)))
        template += [",", _ENCODER.encode(name), ":", "\0" + var + "\1"]
    template.append("}\n")
    # The constant parts become the literal text of one f-string: braces doubled, the placeholders
    # (marked with \0 \1, which the JSON text of a key can never contain raw) turned into {aN}.
    text = "".join(template).replace("{", "{{").replace("}", "}}").replace("\0", "{").replace("\1", "}")
    body.append(f"    return f{text!r}\n")
    namespace: dict[str, Any] = {
        "_tag": tag, "_value": _value, "_enc_str": _enc_str, "_reference": _reference_line,
    }
    exec("".join(body), namespace)  # noqa: S102 - code built only from field names and constants
    fn = namespace["encode"]
    fn.__qualname__ = fn.__name__ = f"encode_{cls.__name__}"
    return fn


_LINE_ENCODERS: dict[type, Callable[[Any], str]] = {}
_event_type = operator.attrgetter("type")


def _encode_line(event: Event) -> str:
    """``encode_event`` as text (ASCII only): the recorder joins a batch and encodes it once."""
    try:
        enc = _LINE_ENCODERS[event.__class__]
    except KeyError:
        enc = _LINE_ENCODERS[event.__class__] = _make_line_encoder(event.__class__)
    return enc(event)


@dataclass(frozen=True)
class RecorderResult:
    """What a recording produced; returned by ``TraceRecorder.close``."""

    path: str
    lines_written: int
    bytes_written: int
    dropped: int  # events the bus discarded because the recorder's queue was full
    lost_after_error: int  # events received after a write error and therefore not written
    write_error: Optional[str]
    counts: dict[str, int] = field(default_factory=dict)  # written lines per event type

    @property
    def ok(self) -> bool:
        return self.write_error is None and self.dropped == 0

    def describe(self) -> str:
        """One line for the CLI."""
        line = f"trace {self.path}: {self.lines_written} lines, {self.bytes_written} bytes"
        if self.dropped:
            line += f", {self.dropped} events dropped (queue full)"
        if self.write_error:
            line += f"; WRITE FAILED: {self.write_error} ({self.lost_after_error} events not written)"
        return line


def _describe_oserror(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno, "") if exc.errno is not None else ""
    reason = exc.strerror or str(exc) or type(exc).__name__
    return f"{name}: {reason}" if name else reason


def _open_trace(path: Path) -> BinaryIO:
    # Unbuffered: each write() is one syscall carrying only whole lines. In place (not a temporary
    # file) so the trace is readable at its path during the run and after a kill; safe_write's rules
    # for links, devices and file modes still apply.
    return open_streaming(path, "trace")


class TraceRecorder:
    """Subscribes to ``bus`` and writes every event to ``path`` as one JSON line.

    The header line (``TraceHeader`` with ``header_meta``) is written synchronously by the
    constructor, so a path problem surfaces as ``RecorderError`` before the run starts. ``opener``
    exists for tests (e.g. a file object that fails with ENOSPC).
    """

    def __init__(
        self,
        path: Union[str, os.PathLike[str]],
        bus: EventBus,
        header_meta: Optional[dict[str, Any]] = None,
        *,
        maxsize: int = 100_000,
        name: str = "recorder",
        opener: Optional[Callable[[Path], BinaryIO]] = None,
    ) -> None:
        self.path = Path(path)
        self.bus = bus
        self.lines_written = 0
        self.bytes_written = 0
        self.lost_after_error = 0
        self.write_error: Optional[str] = None
        self.counts: Counter[str] = Counter()
        self._closed = False
        self._result: Optional[RecorderResult] = None

        try:
            self._file = (opener or _open_trace)(self.path)
        except OSError as exc:
            raise RecorderError(f"cannot write trace {self.path}: {_describe_oserror(exc)}") from None
        except OutputPathError as exc:
            raise RecorderError(f"cannot write {exc}") from None
        header = TraceHeader(meta=dict(header_meta or {}))
        try:
            self._write(encode_event(header), 1)
        except OSError as exc:
            self._file.close()
            raise RecorderError(f"cannot write trace {self.path}: {_describe_oserror(exc)}") from None
        self.counts[header.type] += 1

        # Subscribe only after the header is safely on disk: nothing is queued for a dead file.
        self.subscription: Subscription = bus.subscribe(name, maxsize)
        self._thread = threading.Thread(target=self._run, name=f"graphtop-{name}", daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        return self.subscription.dropped

    # -- background thread ------------------------------------------------------------------------

    def _run(self) -> None:
        sub = self.subscription
        while True:
            first = sub.get(timeout=0.25)
            if first is None:
                if sub.closed and sub.pending == 0:
                    return
                continue
            batch = [first]
            # While events keep coming, poll: sleep an interval, then write whatever piled up. That is
            # one wake-up and a few writes per interval instead of a GIL hand-off per event, and the
            # engine never pays for waking this thread (publish only signals a consumer blocked in
            # get(), which happens again once a whole interval brought nothing).
            while True:
                if not sub.closed:
                    time.sleep(FLUSH_INTERVAL_S)
                batch.extend(sub.drain())
                if not batch:
                    break
                for i in range(0, len(batch), _BATCH):
                    self._write_events(batch[i : i + _BATCH])
                batch = []

    def _write_events(self, events: list[Event]) -> None:
        if self.write_error is not None:
            self.lost_after_error += len(events)
            return
        try:
            # Same bytes as joining encode_event() of each event; the text is ASCII, encoded once per batch.
            data = "".join(map(_encode_line, events)).encode("utf-8")
            self._write(data, len(events))
        except OSError as exc:
            self.write_error = _describe_oserror(exc)
            self.lost_after_error += len(events)
            # Stop costing the engine anything: no more queueing for a recorder that cannot write.
            self.bus.unsubscribe(self.subscription)
            return
        except Exception as exc:  # never let the thread die silently with the engine still running
            self.write_error = f"{type(exc).__name__}: {exc}"
            self.lost_after_error += len(events)
            self.bus.unsubscribe(self.subscription)
            return
        self.counts.update(map(_event_type, events))

    def _write(self, data: bytes, lines: int) -> None:
        """Write ``data`` completely (looping over short writes) and flush."""
        view = memoryview(data)
        while view:
            n = self._file.write(view)
            if n is None:  # non-blocking raw file with nothing written; treat as an I/O error
                raise OSError(errno.EAGAIN, "write would block")
            self.bytes_written += n
            view = view[n:]
        self._file.flush()
        self.lines_written += lines

    # -- shutdown ---------------------------------------------------------------------------------

    def close(self, timeout: float = 30.0) -> RecorderResult:
        """Stop recording: write everything still queued, flush, close the file. Idempotent."""
        if self._result is not None:
            return self._result
        self.bus.unsubscribe(self.subscription)  # no new events; queued ones are still drained
        self._thread.join(timeout)
        if self._thread.is_alive() and self.write_error is None:
            self.write_error = f"recorder thread did not finish within {timeout:g}s"
        try:
            self._file.close()
        except OSError as exc:
            if self.write_error is None:
                self.write_error = _describe_oserror(exc)
        self._result = RecorderResult(
            path=str(self.path),
            lines_written=self.lines_written,
            bytes_written=self.bytes_written,
            dropped=self.subscription.dropped,
            lost_after_error=self.lost_after_error,
            write_error=self.write_error,
            counts=dict(self.counts),
        )
        return self._result

    def __enter__(self) -> "TraceRecorder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
