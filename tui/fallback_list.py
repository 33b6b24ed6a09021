"""Why steps ran eager, ranked: the first place to look when the graph hit rate drops."""

from __future__ import annotations

from textual.content import Content
from textual.widgets import Static

from .fmt import short
from .panel import set_content
from .state import DashboardState

MAX_ROWS = 8


class FallbackList(Static):
    """Eager-step counts per fallback reason, most frequent first."""

    def update_view(self, state: DashboardState) -> None:
        total = sum(state.fallbacks.values())
        if not state.total_steps:
            set_content(self, Content.from_markup("[$text-muted]eager fallbacks[/]\n[$text-muted]no steps yet[/]"))
            return
        if not total:
            set_content(self, Content.from_markup("[$text-muted]eager fallbacks[/]\n[$success]none — every step hit a graph[/]"))
            return
        lines = [Content.from_markup("[$text-muted]eager fallbacks ($n)[/]", n=f"{total:,}")]
        for reason, count in state.fallbacks.most_common(MAX_ROWS):
            lines.append(
                Content.from_markup(
                    "[$warning]$c[/] $pc $r", c=f"{count:>6}", pc=f"{100 * count / total:3.0f}%", r=short(reason, 34)
                )
            )
        set_content(self, Content("\n").join(lines))
