"""Value limits of a trace line, checked by ``events.validate_event_dict`` after the types.

Every number the engine writes is a size, a count, a duration or a timestamp: non-negative and far
below these bounds. A line beyond them is damaged or forged, and letting it through would crash the
readers that do arithmetic on it (Perfetto's microsecond timeline, the summary's percentiles, the
dashboard's gauges). docs/trace-schema.md states the same limits.
"""

from __future__ import annotations

from typing import Any

from ..arguments import is_unicode, short_repr  # noqa: F401 (re-exported: the readers quote bad values with it)


class SchemaError(ValueError):
    """A trace line does not match the event schema."""


MAX_INT = 2**63 - 1
MAX_FLOAT = 2.0**53
MAX_DEPTH = 32  # nesting of free-form values (header meta, graph_config, config_downgrade old/new)


def check_text(name: str, v: str) -> None:
    if not is_unicode(v):
        raise SchemaError(f"field {name!r} is not valid Unicode (lone surrogate)")


def readable_text(text: str) -> str:
    """``text`` the reader accepts: lone surrogates become backslash escapes. A surrogate-escaped byte
    (a non-UTF-8 argv or path, as Python decodes it) is written as that byte, ``\\xff``."""
    if is_unicode(text):
        return text
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate that escapes no byte
        return text.encode("utf-8", "backslashreplace").decode("ascii")


def readable_free(v: Any) -> Any:
    """A free-form value (a trace header's meta) with its text made :func:`readable_text`, keys too.

    Why: ``graphtop --record t.jsonl --prompts $'p\\xff.jsonl'`` put the surrogate-escaped argv in the
    header, and the reader then refused the whole trace over it."""
    if isinstance(v, str):
        return readable_text(v)
    if isinstance(v, list):
        return [readable_free(item) for item in v]
    if isinstance(v, tuple):
        return tuple(readable_free(item) for item in v)
    if isinstance(v, dict):
        return {readable_free(k) if isinstance(k, str) else k: readable_free(item) for k, item in v.items()}
    return v


def check_range(name: str, annotation: Any, v: Any) -> None:
    """Typed numeric fields: finite, non-negative, within the limits above."""
    if annotation is int:
        if not 0 <= v <= MAX_INT:
            raise SchemaError(f"field {name!r} is out of range (0..2**63-1): {short_repr(v)}")
    elif annotation is float:
        if not (0.0 <= v <= MAX_FLOAT):  # also false for NaN
            what = "not finite" if v != v or v in (float("inf"), float("-inf")) else "out of range (0..2**53)"
            raise SchemaError(f"field {name!r} is {what}: {short_repr(v)}")


def check_free(name: str, v: Any, depth: int = 0) -> None:
    """Free-form values (``Any``/``dict`` fields): finite numbers, 64-bit ints, bounded nesting, Unicode."""
    if depth > MAX_DEPTH:
        raise SchemaError(f"field {name!r} is nested deeper than {MAX_DEPTH} levels")
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            raise SchemaError(f"field {name!r} holds a number that is not finite: {short_repr(v)}")
    elif isinstance(v, int) and not isinstance(v, bool):
        if abs(v) > MAX_INT:
            raise SchemaError(f"field {name!r} holds an integer out of range: {short_repr(v)}")
    elif isinstance(v, str):
        check_text(name, v)
    elif isinstance(v, list):
        for item in v:
            check_free(name, item, depth + 1)
    elif isinstance(v, dict):
        for key, item in v.items():
            check_text(name, key)
            check_free(name, item, depth + 1)
