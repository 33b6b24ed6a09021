"""The trace codec: one event -> one JSON line, byte for byte what ``json`` would write.

The recorder thread encodes every event while holding the GIL the engine thread wants, so the
per-event cost shows up directly in the engine's step time. ``encode_event`` therefore uses a
generated encoder per event class (see "fast encoding" below); ``_encode_event_reference`` is the
specification it must match, and the tests hold the two to the same bytes. Reading lines back is
``trace``'s job (``event_from_dict`` in ``events``).
"""

from __future__ import annotations

import dataclasses
import json
import json.encoder
import types
import typing
from typing import Any, Callable, Optional

from .events import Event, _jsonable, _type_hints

__all__ = ["encode_event", "encode_lines"]


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
    body: list[str] = [
        "def encode(ev):\n",
        "    if ev.type is not _tag:\n",
        "        return _reference(ev)\n",
        "    d = ev.__dict__\n",
    ]
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
        "_tag": tag,
        "_value": _value,
        "_enc_str": _enc_str,
        "_reference": _reference_line,
    }
    exec("".join(body), namespace)  # noqa: S102 - code built only from field names and constants
    fn = namespace["encode"]
    fn.__qualname__ = fn.__name__ = f"encode_{cls.__name__}"
    return fn


_LINE_ENCODERS: dict[type, Callable[[Any], str]] = {}


def _encode_line(event: Event) -> str:
    """``encode_event`` as text (ASCII only): the recorder joins a batch and encodes it once."""
    try:
        enc = _LINE_ENCODERS[event.__class__]
    except KeyError:
        enc = _LINE_ENCODERS[event.__class__] = _make_line_encoder(event.__class__)
    return enc(event)


def encode_lines(events: list[Event]) -> bytes:
    """Several trace lines at once: the same bytes as joining ``encode_event`` of each, encoded once
    (the text is ASCII)."""
    return "".join(map(_encode_line, events)).encode("utf-8")
