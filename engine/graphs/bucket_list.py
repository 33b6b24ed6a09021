"""Bucket lists: the one parser and validator for every place a list comes in.

Lists arrive as text typed by a person (``--cuda-graph-bs-decode``, the dashboard's bucket editor:
``1,2,4,8-64:8`` → ``[1, 2, 4, 8, 16, …, 64]``), as JSON (``--cuda-graph-config``) and as Python
lists (``Engine.recapture``). ``parse_buckets`` reads the text; ``check_buckets`` holds every list,
whatever its source, to the same rules (integers, ≥ 1, at most a maximum, not too many), so a list
the editor accepts is a list the engine accepts.

Pure and strict on purpose: a bad bucket list costs a recapture (seconds of GPU time and graph
memory), so every mistake gets a one-line message that names the offending token or value.

Grammar: items separated by commas or whitespace; an item is ``N``, ``A-B`` (step 1) or
``A-B:S``. The result is sorted and de-duplicated.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Optional

from ..arguments import short_repr, short_text

MAX_BUCKETS = 512
"""Most buckets one phase's list may hold: every bucket is a graph to capture (seconds each on a GPU,
more emulated), so a longer list is never what anyone meant. Part of the contract of every bucket-list
input (flags, graph config, recapture): the error names it."""

STATIC_BUFFERS_MAXIMUM = "the static buffers' maximum"
"""How a bucket over a graph runner's static buffers is named (``maximum_label``): the buffers are sized
once, at load, so a recapture cannot go past them. The engine's recapture and the dashboard's editor
check the same limit with the same words."""

MAX_DIGITS = 18
"""Most significant digits a number in a bucket list may have, so the largest bucket or step the text
may name is ``MAX_VALUE``: far over any real bucket (a KV pool in tokens), and counted before ``int()``
sees the digits, whose own limit (4,300 digits) raises a ValueError that is not a BucketSpecError."""

MAX_VALUE = 10**MAX_DIGITS - 1
"""The largest number a bucket list's text may hold (``MAX_DIGITS`` nines)."""

_INT = re.compile(r"[+]?[0-9]+")  # ASCII only: ``\d`` and ``int()`` also take "١٢" or "１２"
_NEG_INT = re.compile(r"-[0-9]+")
_NON_ASCII_DIGIT = re.compile(r"(?![0-9])\d")
_RANGE = re.compile(r"(?P<a>[^-:]*)-(?P<b>[^:]*)(?::(?P<s>.*))?")


class BucketSpecError(ValueError):
    """The bucket list is invalid; ``str(err)`` is a message fit to show inline (one line)."""

    def __init__(self, message: str, token: Optional[str] = None) -> None:
        super().__init__(message)
        self.token = token


def _digits_to_int(digits: str, item: str) -> int:
    """``digits`` (``[+]?[0-9]+``) as an int, refused past ``MAX_DIGITS`` before ``int()`` reads them
    (a pasted 5,000-digit number must be a one-line message, not a crash)."""
    body = digits.lstrip("+").lstrip("0")
    if len(body) > MAX_DIGITS:
        raise BucketSpecError(
            f"'{short_text(item)}': a {len(body):,}-digit number, over the largest a list takes ({MAX_VALUE:,})", item
        )
    return int(body or "0")


def _int(token: str, part: str, item: str, what: str = "buckets") -> int:
    """``part`` of a range item as an int; ``what`` names it in a refusal ("the step" for ``A-B:S``)."""
    part = part.strip()
    if part.startswith("-") and _INT.fullmatch(part[1:]):
        raise BucketSpecError(f"'{short_text(item)}': {what} must be ≥ 1", item)
    if not _INT.fullmatch(part):
        if part == "":
            raise BucketSpecError(f"'{short_text(item)}': bad range, write A-B or A-B:STEP", item)
        raise BucketSpecError(f"'{short_text(part)}' is not an integer", item)
    return _digits_to_int(part, item)


def parse_buckets(
    text: str,
    *,
    name: str = "bucket",
    maximum: Optional[int] = None,
    maximum_label: str = "the maximum",
    max_count: int = MAX_BUCKETS,
) -> list[int]:
    """Return the sorted, unique buckets in ``text`` or raise :class:`BucketSpecError`.

    The syntax is checked here, token by token; the values then go through ``check_buckets`` (see
    there for ``name``, ``maximum``, ``maximum_label`` and ``max_count``).
    """
    items = [t for t in re.split(r"[,\s]+", text.strip()) if t]
    if len(items) > max_count:  # refused before anything is built
        raise BucketSpecError(f"{name} list has {len(items):,} items, over the limit of {max_count} buckets")
    if not items:
        raise BucketSpecError("empty: enter at least one bucket, e.g. 1,2,4,8-64:8")
    out: set[int] = set()
    for item in items:
        if _NON_ASCII_DIGIT.search(item):
            raise BucketSpecError(f"'{short_text(item)}': write numbers with the digits 0-9", item)
        if _INT.fullmatch(item):
            value = _digits_to_int(item, item)
            if value <= 0:
                raise BucketSpecError(f"'{short_text(item)}': buckets must be ≥ 1", item)
            values: Iterable[int] = [value]
        elif _NEG_INT.fullmatch(item):
            raise BucketSpecError(f"'{short_text(item)}': buckets must be ≥ 1", item)
        else:
            m = _RANGE.fullmatch(item)
            if m is None:
                if ":" in item:
                    raise BucketSpecError(f"'{short_text(item)}': a step needs a range, write A-B:STEP", item)
                raise BucketSpecError(f"'{short_text(item)}' is not an integer", item)
            a = _int(item, m.group("a"), item)
            b = _int(item, m.group("b"), item)
            s = 1 if m.group("s") is None else _int(item, m.group("s"), item, "the step")
            if a <= 0:
                raise BucketSpecError(f"'{short_text(item)}': buckets must be ≥ 1", item)
            if s <= 0:
                raise BucketSpecError(f"'{short_text(item)}': the step must be ≥ 1", item)
            if b < a:
                raise BucketSpecError(f"'{short_text(item)}': bad range, {b} is below {a}", item)
            count = (b - a) // s + 1  # under 10**MAX_DIGITS: a, b and s are capped above
            if count > max_count:
                raise BucketSpecError(
                    f"'{short_text(item)}' expands to {count:,} buckets, over the limit of {max_count}", item
                )
            values = range(a, b + 1, s)
        try:  # the values so far, so a message names the item that broke a rule
            # de-duplicated first: check_buckets counts what it is given, and "1-300,1-300" is 300 buckets
            out = set(
                check_buckets(
                    out.union(values), name=name, maximum=maximum, maximum_label=maximum_label, max_count=max_count
                )
            )
        except BucketSpecError as e:
            raise BucketSpecError(str(e), item) from None
    return sorted(out)


def check_buckets(
    values: Iterable[Any],
    *,
    name: str = "bucket",
    maximum: Optional[int] = None,
    maximum_label: str = "the maximum",
    max_count: int = MAX_BUCKETS,
) -> list[int]:
    """The sorted, unique buckets of ``values``, or :class:`BucketSpecError` naming the first bad one.

    ``name`` says what a value is in the message ("decode bucket"); ``maximum`` is the largest bucket
    that makes sense (max running requests for decode, the KV pool or the static buffers' size) and
    ``maximum_label`` names it ("max running" → "bucket 128 is over max running (64)").
    """
    values = list(values)
    if not values:
        raise BucketSpecError(f"{name} list is empty")
    if len(values) > max_count:  # counted before de-duplication: refused before anything is built
        raise BucketSpecError(f"{name} list has {len(values):,} buckets, over the limit of {max_count}")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int):
            raise BucketSpecError(f"{name} {short_repr(v)} is not an integer")
        if v <= 0:
            raise BucketSpecError(f"{name} {v} must be positive")
    out = sorted(set(values))
    if maximum is not None and out[-1] > maximum:
        first = next(v for v in out if v > maximum)
        raise BucketSpecError(f"{name} {first} is over {maximum_label} ({maximum})")

    return out


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
