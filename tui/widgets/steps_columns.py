"""Which columns of the steps table fit, and how wide: the full table or its compact form.

The full table (every column, DataTable's padding) needs about 100 cells. Where it does not fit, the
compact form keeps what a person scans for (the step, its phase, its size, the bucket, padding,
graph or eager, why, replay time): decode's batch size and prefill's token count share one ``size``
column (a decode step's tokens are its batch size; a prefill step's batch is its token count's
business), phases are abbreviated, cells are closer, and the fallback reason takes the room that is
left. If even that is too wide, the replay time and then the padding go. Pure, so it is tested
without a terminal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ..fmt import short

COLUMNS = ("step", "phase", "bs", "tok", "bucket", "pad", "path", "fallback", "replay ms", "host ms")
"""The full table's columns, in the order ``steps_table.row_values`` gives a step's cells."""
STEP, PHASE, BS, TOK, BUCKET, PAD, PATH, FALLBACK, REPLAY, HOST = range(len(COLUMNS))
FULL_PADDING = 1
"""Blank cells either side of every cell in the full table, as DataTable's ``cell_padding``."""
MIN_REASON = 8
"""Narrower than this, a fallback reason is no longer readable: drop a column instead."""


@dataclass(frozen=True)
class Column:
    title: str
    width: int
    cell: Callable[[Sequence[str]], str]
    path: bool = False  # the graph/eager column, coloured by the table


@dataclass(frozen=True)
class ColumnPlan:
    columns: tuple[Column, ...]
    padding: int  # blank cells on each side (full) or after (compact) a cell
    compact: bool

    @property
    def width(self) -> int:
        per_cell = 2 * self.padding if not self.compact else self.padding
        return sum(c.width for c in self.columns) + per_cell * len(self.columns) + (1 if self.compact else 0)

    def header(self) -> str:
        lead, before, after = (
            (" ", "", " " * self.padding) if self.compact else ("", " " * self.padding, " " * self.padding)
        )
        return lead + "".join(before + c.title.ljust(c.width)[: c.width] + after for c in self.columns)

    def render(self, cells: Sequence[str]) -> list[tuple[str, bool]]:
        """The row as (text, is the path cell) pieces, padded, ready to style."""
        out: list[tuple[str, bool]] = [(" ", False)] if self.compact else []
        before, after = (" " * self.padding, " " * self.padding) if not self.compact else ("", " " * self.padding)
        for col in self.columns:
            text = col.cell(cells)[: col.width]
            if col.path:  # only the word is coloured, as in DataTable's cells
                out += [(before, False), (text, True), (" " * (col.width - len(text)) + after, False)]
            else:
                out.append((before + text.ljust(col.width) + after, False))
        return out


def _get(i: int) -> Callable[[Sequence[str]], str]:
    return lambda cells: cells[i]


def _size(cells: Sequence[str]) -> str:
    return cells[TOK] if cells[PHASE].startswith("prefill") else cells[BS]


def _phase(cells: Sequence[str]) -> str:
    return cells[PHASE][:3]


def full_plan(widths: Sequence[int]) -> ColumnPlan:
    widths = [max(w, 5) if i == PATH else w for i, w in enumerate(widths)]  # "graph" / "eager"
    return ColumnPlan(
        tuple(Column(name, w, _get(i), i == PATH) for i, (name, w) in enumerate(zip(COLUMNS, widths))),
        FULL_PADDING,
        compact=False,
    )


def plan_columns(widths: Sequence[int], available: int) -> ColumnPlan:
    """The widest plan that fits ``available`` cells, given each full column's natural width."""
    widths = [max(w, 5) if i == PATH else w for i, w in enumerate(widths)]
    full = full_plan(widths)
    if full.width <= available:
        return full
    no_host = ColumnPlan(full.columns[:HOST], FULL_PADDING, compact=False)  # host time: the least read
    if no_host.width <= available:
        return no_host
    reason_width = widths[FALLBACK]

    def compact(keep: Sequence[int]) -> ColumnPlan:
        cols = []
        for i in keep:
            if i == PHASE:
                cols.append(Column("ph", 3, _phase))
            elif i == BS:
                cols.append(Column("size", max(4, widths[BS], widths[TOK]), _size))
            elif i == FALLBACK:
                cols.append(Column("fallback", 0, _get(FALLBACK)))
            else:
                cols.append(Column(COLUMNS[i], widths[i], _get(i), i == PATH))
        plan = ColumnPlan(tuple(cols), 1, compact=True)
        room = max(available - plan.width, 0)
        width = min(room, reason_width)
        cols = [
            Column(c.title, width, (lambda cells, w=width: short(cells[FALLBACK], w))) if c.title == "fallback" else c
            for c in cols
        ]
        return ColumnPlan(tuple(cols), 1, compact=True)

    keep = [STEP, PHASE, BS, BUCKET, PAD, PATH, FALLBACK, REPLAY]
    for drop in (None, REPLAY, PAD):
        if drop is not None:
            keep.remove(drop)
        plan = compact(keep)
        reason = next(c for c in plan.columns if c.title == "fallback")
        if reason.width >= min(MIN_REASON, reason_width):
            return plan
    return plan
