"""A sparkline on a fixed 0-100 % scale, for levels such as KV pool use.

Textual's ``Sparkline`` scales each chart from its own minimum to its maximum, so a pool that never
left 0 % (or held one sample) draws rows of full blocks, and 2 % against 3 % looks like empty
against full. A level has an absolute scale: here an empty pool draws nothing and a full one draws
full columns, coloured by how close to full they are.
"""

from __future__ import annotations

from typing import Sequence

from rich.segment import Segment
from textual.reactive import reactive
from textual.strip import Strip
from textual.widget import Widget

BLOCKS = " ▁▂▃▄▅▆▇█"
HIGH = 0.9
MID = 0.7


def columns(data: Sequence[float], width: int) -> list[float]:
    """The newest ``width`` samples, one per column (right-aligned), clamped to [0, 1]."""
    tail = list(data)[-width:] if width > 0 else []
    return [0.0] * (width - len(tail)) + [min(max(v, 0.0), 1.0) for v in tail]


def cell(rows: float, row_from_bottom: int) -> str:
    """The block for one cell of a column filled ``rows`` rows high (in eighths of a row)."""
    eighths = round(rows * 8) - row_from_bottom * 8
    return BLOCKS[min(max(eighths, 0), 8)]


class LevelSparkline(Widget):
    """Samples in [0, 1], newest on the right; colours from the component classes by level."""

    COMPONENT_CLASSES = {"level-spark--low", "level-spark--mid", "level-spark--high"}
    DEFAULT_CSS = """
    LevelSparkline {
        height: 2;
        & > .level-spark--low { color: $success; }
        & > .level-spark--mid { color: $warning; }
        & > .level-spark--high { color: $error; }
    }
    """

    data: reactive[tuple[float, ...]] = reactive(tuple)

    def render_line(self, y: int) -> Strip:
        width, height = self.size
        row = height - 1 - y
        styles = [self.get_component_rich_style(f"level-spark--{k}") for k in ("low", "mid", "high")]
        base = self.rich_style
        segments = []
        for value in columns(self.data, width):
            ch = cell(value * height, row)
            style = styles[2] if value >= HIGH else styles[1] if value >= MID else styles[0]
            segments.append(Segment(ch, base + style if ch != " " else base))
        return Strip(segments, width)
