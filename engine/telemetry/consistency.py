"""Values a trace line may hold one by one but no engine writes together: checked after the schema.

Why: each field of a ``step`` line can be a valid count while the line is impossible (``"bucket": 0``
with 48 padded tokens), and every reader then reports it as fact: the summary said "48 padded of 0
bucket tokens" and 0.0 % waste. What a step's fields mean (``engine/step/events.py`` writes them): a
step runs ``batch_size`` requests and ``num_tokens`` tokens (each request at least one); a graph step
replays ``bucket`` rows (decode) or tokens (prefill, mixed) and pads its real ones up to it, so
``padded`` is the difference and ``padding_waste`` is ``padded / bucket``; an eager step has no
bucket and no padding. ``validate_event_dict`` calls :func:`check_consistent` on every line, so the
trace reader refuses such a line with its line number, and an export leaves it out.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from .value_limits import SchemaError, short_repr

PATHS = ("graph", "eager")
DECODE = "decode"


def check_consistent(tag: str, obj: dict[str, Any]) -> None:
    """Raise ``SchemaError`` when a schema-valid event object holds values that contradict each other."""
    check = _CHECKS.get(tag)
    if check is not None:
        try:
            check(obj)
        except SchemaError as exc:
            raise SchemaError(f"{tag}: impossible values: {exc}") from None


def _real(obj: dict[str, Any]) -> tuple[int, str]:
    """What a bucket of this step counts (rows for decode, tokens otherwise), and its unit."""
    batch, tokens = obj["batch_size"], obj["num_tokens"]
    if tokens < batch:
        raise SchemaError(f"{batch} requests in {tokens} tokens (each request has at least one)")
    return (batch, "rows") if obj["phase"] == DECODE else (tokens, "tokens")


def _check_bucket(obj: dict[str, Any]) -> None:
    real, unit = _real(obj)
    bucket = obj["bucket"]
    if bucket is None:
        return
    if bucket == 0:
        raise SchemaError(f"bucket 0 (a graph holds at least one of its {unit})")
    if bucket < real:
        raise SchemaError(f"bucket {bucket} is smaller than the step's {real} {unit}")


def _check_step(obj: dict[str, Any]) -> None:
    path, bucket, padded, waste = obj["path"], obj["bucket"], obj["padded"], obj["padding_waste"]
    if path not in PATHS:
        raise SchemaError(f"path {short_repr(path)} is neither graph nor eager")
    _check_bucket(obj)
    if path == "eager":
        if bucket is not None or padded or waste:
            raise SchemaError(
                f"an eager step with bucket {short_repr(bucket)}, padded {padded}, padding_waste "
                f"{short_repr(waste)} (an eager step runs no bucket and pads nothing)"
            )
        return
    if bucket is None:
        raise SchemaError("a graph step without a bucket")
    real, unit = _real(obj)
    if padded != bucket - real:
        raise SchemaError(
            f"padded {padded} with {real} {unit} in bucket {bucket} (padding fills the bucket: {bucket - real})"
        )
    if not math.isclose(waste, padded / bucket, rel_tol=1e-9, abs_tol=1e-12):
        raise SchemaError(f"padding_waste {short_repr(waste)} is not padded / bucket ({padded} / {bucket})")


def _check_parity(obj: dict[str, Any]) -> None:
    _check_bucket(obj)
    for name in ("argmax_agree", "top5_overlap"):
        if obj[name] > 1.0:
            raise SchemaError(f"{name} {short_repr(obj[name])} is a fraction of the rows, at most 1")


_CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {"step": _check_step, "parity_check": _check_parity}
