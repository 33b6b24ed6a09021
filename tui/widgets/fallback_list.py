"""Why steps ran eager, ranked: the first place to look when the graph hit rate drops.

Hovering a reason explains it: what it means and what to do about it (``explain.FALLBACK_REASONS``,
also listed on the help screen).
"""

from __future__ import annotations

from textual.content import Content

from ..explain import explain_fallback
from ..state import DashboardState
from .tipped_lines import TippedLines

MAX_ROWS = 8


class FallbackList(TippedLines):
    """Eager-step counts per fallback reason, most frequent first."""

    def update_view(self, state: DashboardState) -> None:
        total = sum(state.fallbacks.values())
        if not state.total_steps:
            self.show(
                [
                    Content.from_markup("[$text-muted]eager fallbacks[/]"),
                    Content.from_markup("[$text-muted]no steps yet[/]"),
                ]
            )
            return
        if not total:
            self.show(
                [
                    Content.from_markup("[$text-muted]eager fallbacks[/]"),
                    Content.from_markup("[$success]none — every step hit a graph[/]"),
                ]
            )
            return
        lines = [Content.from_markup("[$text-muted]eager fallbacks ($n) · hover: why[/]", n=f"{total:,}")]
        tips: list = ["steps that ran eagerly, by the reason the engine gave"]
        for reason, count in state.fallbacks.most_common(MAX_ROWS):
            lines.append(
                Content.from_markup(
                    "[$warning]$c[/] $pc $r", c=f"{count:>6}", pc=f"{100 * count / total:3.0f}%", r=reason
                )
            )
            tips.append(explain_fallback(reason).line(reason))
        self.show(lines, tips)
