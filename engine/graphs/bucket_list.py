"""Bucket lists: one frozen type, ``BucketList``, whose constructor is the one validation.

Lists arrive as text typed by a person (``--cuda-graph-bs-decode``, the dashboard's bucket editor:
``1,2,4,8-64:8`` → ``[1, 2, 4, 8, 16, …, 64]``), as JSON (``--cuda-graph-config``) and as Python
lists (``Engine.recapture``). ``BucketList.parse`` reads the text; ``BucketList(values)`` holds every
list, whatever its source, to the same rules (integers, ≥ 1, at most a maximum, not too many) with the
same words, so a list the editor accepts is a list the engine accepts, and a bad list is refused with
the same message at every door. Each door only says which input it was (``--cuda-graph-bs-decode: …``,
``cuda graph config: decode.bs: …``, ``decode buckets: …``).

Pure and strict on purpose: a bad bucket list costs a recapture (seconds of GPU time and graph
memory), so every mistake gets a one-line message that names the offending item or value.

Grammar: items separated by commas or whitespace; an item is ``N``, ``A-B`` (step 1) or
``A-B:S``. The result is sorted and de-duplicated.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Optional

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
        raise _over_max_value(item, len(body))
    return int(body or "0")


def _over_max_value(item: str, digits: int) -> BucketSpecError:
    return BucketSpecError(
        f"'{short_text(item)}': a {digits:,}-digit number, over the largest a list takes ({MAX_VALUE:,})", item
    )


def _digit_count(value: int) -> int:
    """Decimal digits of a positive int, without ``str()`` (which refuses past 4,300 digits) for a huge one."""
    if value.bit_length() < 10_000:
        return len(str(value))
    return int(value.bit_length() * math.log10(2)) + 1  # may be one short: the message's figure is a scale


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


def _item_of(value: Any) -> str:
    """A list's value as the item a message quotes: a string as it is (the same words as the text
    ``x`` gets), anything else as ``repr`` (a 5,000-digit int described, not printed)."""
    return short_text(value) if isinstance(value, str) else short_repr(value)


def _too_many(count: int, max_count: int) -> BucketSpecError:
    return BucketSpecError(f"{count:,} items, over the limit of {max_count} buckets")


EMPTY = "empty: give at least one bucket, e.g. 1,2,4,8-64:8"


@dataclass(frozen=True, init=False)
class BucketList:
    """The buckets of one phase (decode batch sizes, prefill token counts): sorted, unique, each an
    integer from 1 to ``MAX_VALUE`` and at most ``maximum``, at most ``max_count`` of them.

    The constructor is the validation every door shares, so holding a ``BucketList`` means holding a
    list that was checked; it raises :class:`BucketSpecError` naming the first bad value.
    ``maximum`` is the largest bucket that makes sense (max running requests for decode, the KV pool or
    the static buffers' size) and ``maximum_label`` names it ("bucket 128 is over max running (64)").
    """

    sizes: tuple[int, ...]

    def __init__(
        self,
        values: Iterable[Any],
        *,
        maximum: Optional[int] = None,
        maximum_label: str = "the maximum",
        max_count: int = MAX_BUCKETS,
    ) -> None:
        values = list(values)
        if not values:
            raise BucketSpecError(EMPTY)
        if len(values) > max_count:  # counted before de-duplication: refused before anything is built
            raise _too_many(len(values), max_count)
        for v in values:
            if isinstance(v, bool) or not isinstance(v, int):
                raise BucketSpecError(f"'{_item_of(v)}' is not an integer", _item_of(v))
            if v <= 0:
                raise BucketSpecError(f"'{v}': buckets must be ≥ 1", str(v))
            if v > MAX_VALUE:
                raise _over_max_value(str(v) if v.bit_length() < 10_000 else short_repr(v), _digit_count(v))
        out = sorted(set(values))
        if maximum is not None and out[-1] > maximum:
            first = next(v for v in out if v > maximum)
            raise BucketSpecError(f"bucket {first} is over {maximum_label} ({maximum})", str(first))
        object.__setattr__(self, "sizes", tuple(out))

    @classmethod
    def parse(
        cls,
        text: str,
        *,
        maximum: Optional[int] = None,
        maximum_label: str = "the maximum",
        max_count: int = MAX_BUCKETS,
    ) -> "BucketList":
        """The buckets ``text`` names (the grammar above), or :class:`BucketSpecError` naming the item.

        The syntax is checked here, item by item; the values then go through the constructor, so text
        and lists break the same rules with the same words.
        """
        items = [t for t in re.split(r"[,\s]+", text.strip()) if t]
        if len(items) > max_count:  # refused before anything is built
            raise _too_many(len(items), max_count)
        if not items:
            raise BucketSpecError(EMPTY)
        out: set[int] = set()
        for item in items:
            values = _item_values(item, max_count)
            try:  # the values so far, so a message names the item that broke a rule
                # de-duplicated first: the constructor counts what it is given, and "1-300,1-300" is 300 buckets
                out = set(
                    cls(out.union(values), maximum=maximum, maximum_label=maximum_label, max_count=max_count).sizes
                )
            except BucketSpecError as e:
                raise BucketSpecError(str(e), item) from None
        return cls(out, maximum=maximum, maximum_label=maximum_label, max_count=max_count)

    def __iter__(self) -> Iterator[int]:
        return iter(self.sizes)

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, index: int) -> int:
        return self.sizes[index]

    def as_list(self) -> list[int]:
        """The sizes as the JSON-shaped list configs and events hold."""
        return list(self.sizes)

    def __str__(self) -> str:
        return format_buckets(self.sizes)


def _item_values(item: str, max_count: int) -> Iterable[int]:
    """The buckets one item of the text names (``N``, ``A-B`` or ``A-B:S``); syntax only, the values'
    own rules are the constructor's."""
    if _NON_ASCII_DIGIT.search(item):
        raise BucketSpecError(f"'{short_text(item)}': write numbers with the digits 0-9", item)
    if _INT.fullmatch(item):
        value = _digits_to_int(item, item)
        if value <= 0:
            raise BucketSpecError(f"'{short_text(item)}': buckets must be ≥ 1", item)
        return [value]
    if _NEG_INT.fullmatch(item):
        raise BucketSpecError(f"'{short_text(item)}': buckets must be ≥ 1", item)
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
        raise BucketSpecError(f"'{short_text(item)}' expands to {count:,} buckets, over the limit of {max_count}", item)
    return range(a, b + 1, s)


def format_buckets(buckets: Iterable[int]) -> str:
    """The inverse of :meth:`BucketList.parse`: compact text, runs of 3+ equal steps become ranges."""
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
