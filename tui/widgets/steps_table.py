"""The most recent steps, newest first: which bucket each hit, padding, path, why it fell back.

Where the full table does not fit, it shows its compact form (``steps_columns.plan_columns``) instead
of a horizontal scrollbar; hovering a row explains its fallback reason (tooltip).

A Line-API widget rather than a ``DataTable``: the table changes on every refresh while the engine
runs, and ``DataTable`` re-measures and re-renders every visible cell through Rich on each change
(~30 ms of GIL per update at 200×60, taken straight out of the engine thread's decode loop). Here a
row is a handful of pre-styled segments, built once per update and cached per line.
"""

from __future__ import annotations

from typing import Any, Optional

from rich.segment import Segment
from rich.style import Style
from textual.color import Color
from textual.geometry import Region, Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from graphtop.engine.telemetry.events import StepEvent

from ..explain import explain_fallback
from ..fmt import ms, short
from ..safe_text import literal, printable
from ..state import DashboardState
from .steps_columns import COLUMNS, FALLBACK, ColumnPlan, plan_columns

ROWS = 40


def row_values(s: StepEvent) -> tuple[Any, ...]:
    """One step as the table's cell values (``get_row_at`` returns these)."""
    pad = s.padded if s.bucket is not None else None
    return (
        s.step,
        s.phase,
        s.batch_size,
        s.num_tokens,
        "—" if s.bucket is None else s.bucket,
        "—" if pad is None else f"{pad} ({s.padding_waste * 100:.0f}%)",
        "graph" if s.path == "graph" else "eager",
        s.fallback_reason or "",
        ms(s.replay_ms),
        ms(s.host_ms),
    )


class StepsTable(ScrollView, can_focus=True):
    """A header plus up to 40 zebra-striped rows; scrollable (pause with space to browse them)."""

    COMPONENT_CLASSES = {
        "steps-table--header",
        "steps-table--odd-row",
        "steps-table--even-row",
        "steps-table--graph",
        "steps-table--eager",
    }
    # Mirrors DataTable's look (theme variables only) so the panel reads the same as before.
    DEFAULT_CSS = """
    StepsTable {
        background: $surface;
        color: $foreground;
        height: auto;
        max-height: 100%;
        scrollbar-visibility: hidden;  /* a thumb drawn in the last column read as a glyph in the rows */
        &:focus {
            background-tint: $foreground 5%;
            & > .steps-table--header { background-tint: $foreground 5%; }
        }
        & > .steps-table--header { text-style: bold; background: $panel; color: $foreground; }
        & > .steps-table--even-row { background: $surface-lighten-1 50%; }
        &:dark > .steps-table--even-row { background: $surface-darken-1 40%; }
        & > .steps-table--graph { color: $success; }
        & > .steps-table--eager { color: $warning; }
    }
    """

    def __init__(self, *, id: Optional[str] = None) -> None:
        super().__init__(id=id)
        self._rows: list[tuple[Any, ...]] = []
        self._cells: list[tuple[str, ...]] = []
        self._widths = [len(c) for c in COLUMNS]  # never shrink, like DataTable's auto width
        self._key: Optional[tuple[int, int, int]] = None
        self._lines: dict[int, Strip] = {}
        self._style_key: Any = None
        self._styles: dict[str, Any] = {}
        self._plan_key: Any = None
        self._plan: Optional[ColumnPlan] = None

    # ------------------------------------------------------------------ data
    @property
    def row_count(self) -> int:
        return len(self._rows)

    def get_row_at(self, index: int) -> tuple[Any, ...]:
        """The cell values of row ``index`` (0 is the newest step)."""
        return self._rows[index]

    def update_view(self, state: DashboardState) -> None:
        """Show the newest ``ROWS`` steps; a no-op when no step arrived since the last call."""
        steps = state.steps
        key = (id(steps), state.total_steps, len(steps))
        if key == self._key:
            return
        self._key = key
        n = min(ROWS, len(steps))
        rows = [row_values(steps[-1 - i]) for i in range(n)]
        cells = [tuple(short(printable(str(v)), 32) for v in r) for r in rows]
        widths = self._widths
        for row in cells:
            for i, text in enumerate(row):
                if len(text) > widths[i]:
                    widths[i] = len(text)
        self._rows, self._cells = rows, cells
        self._lines.clear()
        self._fit(n)
        self.refresh()

    def plan(self) -> ColumnPlan:
        """The columns that fit the table's width now (the full table, or its compact form)."""
        width = self.scrollable_content_region.width or self.size.width
        key = (width, tuple(self._widths))
        if key != self._plan_key or self._plan is None:
            self._plan_key = key
            self._plan = plan_columns(self._widths, width)
            self._lines.clear()
        return self._plan

    def _fit(self, rows: int) -> None:
        self.virtual_size = Size(self.plan().width, rows + 1)

    def on_resize(self) -> None:
        self._fit(len(self._cells))

    def on_mouse_move(self, event: Any) -> None:
        """The hovered row's fallback reason, explained (graph rows have none)."""
        row = event.y - 1 + self.scroll_offset.y
        reason = self._rows[row][FALLBACK] if 0 <= row < len(self._rows) and event.y > 0 else ""
        self.tooltip = literal(explain_fallback(reason).line(reason)) if reason else None

    # ------------------------------------------------------------------ rendering
    def _resolve_styles(self) -> dict[str, Any]:
        """Per row kind: (row style, path colours, margin style), re-read only when the theme,
        focus, size or scroll moved; cached lines are dropped then too."""
        key = (self.app.theme, self.has_focus, self.size, self.scroll_offset)
        if key != self._style_key:
            self._style_key = key
            self._lines.clear()
            get = self.get_component_rich_style
            background = self.background_colors[1]
            graph = Style(color=get("steps-table--graph").color)
            eager = Style(color=get("steps-table--eager").color)
            styles: dict[str, Any] = {"base": self.rich_style}
            for kind in ("header", "even-row", "odd-row"):
                row_style = get(f"steps-table--{kind}")
                margin = Style.from_color(row_style.color, row_style.bgcolor)
                if row_style.bgcolor is not None:  # as DataTable: the row's colour fades into the margin
                    faded = Color.from_rich_color(row_style.bgcolor).blend(background, factor=0.25)
                    margin = Style.from_color(row_style.color, faded.rich_color)
                styles[kind] = (row_style, row_style + graph, row_style + eager, margin)
            self._styles = styles
        return self._styles

    def render_lines(self, crop: Region) -> list[Strip]:
        self._resolve_styles()  # once per repaint, not once per line
        return super().render_lines(crop)

    def render_line(self, y: int) -> Strip:
        row = -1 if y == 0 else y - 1 + self.scroll_offset.y
        strip = self._lines.get(row)
        if strip is None:
            strip = self._lines[row] = self._render_row(row)
        return strip

    def _render_row(self, row: int) -> Strip:
        """One line: the plan's cells in the row style, the path word coloured, then the margin."""
        styles = self._styles
        width = self.size.width
        if row >= len(self._cells):
            return Strip.blank(width, styles["base"])
        plan = self.plan()
        if row < 0:
            row_style, _, _, margin = styles["header"]
            segments = [Segment(plan.header(), row_style)]
        else:
            cells = self._cells[row]
            row_style, graph, eager, margin = styles["even-row" if row % 2 == 0 else "odd-row"]
            segments = [
                Segment(text, (graph if text == "graph" else eager) if word else row_style)
                for text, word in plan.render(cells)
            ]
        table_width = plan.width
        if width > table_width:
            segments.append(Segment(" " * (width - table_width), margin))
        strip = Strip(segments)
        x = self.scroll_offset.x
        if x:
            strip = strip.crop(x, x + width)
        return strip.adjust_cell_length(width, styles["base"])
