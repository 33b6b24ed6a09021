"""Parse bucket lists typed by a person: ``1,2,4,8-64:8`` → ``[1, 2, 4, 8, 16, …, 64]``.

Pure and strict on purpose: a bad bucket list costs a recapture (seconds of GPU time and graph
memory), so every mistake gets a one-line message that names the offending token.

Grammar: items separated by commas or whitespace; an item is ``N``, ``A-B`` (step 1) or
``A-B:S``. The result is sorted and de-duplicated.
"""

from __future__ import annotations

import re
from typing import Iterable, Optional

from graphtop.engine.graphs.config import MAX_BUCKETS  # the engine's limit: one number

_INT = re.compile(r"[+]?\d+")
_RANGE = re.compile(r"(?P<a>[^-:]*)-(?P<b>[^:]*)(?::(?P<s>.*))?")


class BucketSpecError(ValueError):
    """The bucket text is invalid; ``str(err)`` is a message fit to show inline."""

    def __init__(self, message: str, token: Optional[str] = None) -> None:
        super().__init__(message)
        self.token = token


def _int(token: str, part: str, item: str) -> int:
    part = part.strip()
    if part.startswith("-") and _INT.fullmatch(part[1:]):
        raise BucketSpecError(f"'{item}': buckets must be ≥ 1", item)
    if not _INT.fullmatch(part):
        if part == "":
            raise BucketSpecError(f"'{item}': bad range, write A-B or A-B:STEP", item)
        raise BucketSpecError(f"'{part}' is not an integer", item)
    return int(part)


def parse_buckets(
    text: str,
    *,
    maximum: Optional[int] = None,
    maximum_label: str = "the maximum",
    max_count: int = MAX_BUCKETS,
) -> list[int]:
    """Return the sorted, unique buckets in ``text`` or raise :class:`BucketSpecError`.

    ``maximum`` is the largest bucket that makes sense (max running requests for decode, the KV
    pool size for prefill); ``maximum_label`` names it in the message (e.g. "max running 64").
    """
    items = [t for t in re.split(r"[,\s]+", text.strip()) if t]
    if not items:
        raise BucketSpecError("empty: enter at least one bucket, e.g. 1,2,4,8-64:8")
    out: set[int] = set()
    for item in items:
        if _INT.fullmatch(item):
            values: Iterable[int] = [int(item)]
            if int(item) <= 0:
                raise BucketSpecError(f"'{item}': buckets must be ≥ 1", item)
        elif re.fullmatch(r"-\d+", item):
            raise BucketSpecError(f"'{item}': buckets must be ≥ 1", item)
        else:
            m = _RANGE.fullmatch(item)
            if m is None:
                if ":" in item:
                    raise BucketSpecError(f"'{item}': a step needs a range, write A-B:STEP", item)
                raise BucketSpecError(f"'{item}' is not an integer", item)
            a = _int(item, m.group("a"), item)
            b = _int(item, m.group("b"), item)
            s = 1 if m.group("s") is None else _int(item, m.group("s"), item)
            if a <= 0:
                raise BucketSpecError(f"'{item}': buckets must be ≥ 1", item)
            if s <= 0:
                raise BucketSpecError(f"'{item}': the step must be ≥ 1", item)
            if b < a:
                raise BucketSpecError(f"'{item}': bad range, {b} is below {a}", item)
            if (b - a) // s + 1 > max_count:
                raise BucketSpecError(
                    f"'{item}' expands to {(b - a) // s + 1} buckets, over the limit of {max_count}", item
                )
            values = range(a, b + 1, s)
        for v in values:
            if maximum is not None and v > maximum:
                raise BucketSpecError(f"{v} is over {maximum_label} ({maximum})", item)
            out.add(v)
        if len(out) > max_count:
            raise BucketSpecError(f"{len(out)} buckets is over the limit of {max_count}", item)
    return sorted(out)


def format_buckets(buckets: Iterable[int]) -> str:
    """The inverse of :func:`parse_buckets`: compact text, runs of 3+ equal steps become ranges."""
    values = sorted(set(buckets))
    parts: list[str] = []
    i = 0
    while i < len(values):
        j = i
        if i + 2 < len(values):
            step = values[i + 1] - values[i]
            j = i + 1
            while j + 1 < len(values) and values[j + 1] - values[j] == step:
                j += 1
            if j - i >= 2:
                parts.append(f"{values[i]}-{values[j]}" + ("" if step == 1 else f":{step}"))
                i = j + 1
                continue
        parts.append(str(values[i]))
        i += 1
    return ",".join(parts)
