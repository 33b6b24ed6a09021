"""The view bar of a small terminal: which view shows, which are one key away, and their headline.

Below ``DashboardScreen.COMPACT_WIDTH`` x ``COMPACT_HEIGHT`` the panels do not fit side by side, so
one view shows at a time (like btop's boxes). This bar keeps the hidden ones honest: each tab names
its key and the number that matters most in it (hit rate, KV use, capture progress, streams), so
nothing is out of sight without a hint. Tabs are clickable too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from textual.content import Content
from textual.widgets import Static

from ..fmt import pct
from ..state import DashboardState
from .panel import set_content

VIEWS: tuple[tuple[str, str, str], ...] = (
    # name, key, title
    ("steps", "1", "steps"),
    ("memory", "2", "memory"),
    ("capture", "3", "capture"),
    ("prompt", "4", "prompts"),
)


@dataclass(frozen=True)
class ViewHints:
    """What the bar needs beyond the state: the prompt console's requests still streaming."""

    streaming: int = 0


def view_headline(name: str, state: DashboardState, hints: ViewHints) -> str:
    """The one number a hidden view would show first."""
    if name == "steps":
        eager = sum(state.fallbacks.values())
        if not state.total_steps:
            return "no steps"
        return f"hit {pct(state.hit_rate())}" + (f" · eager {eager:,}" if eager else "")
    if name == "memory":
        kv = state.kv
        return f"KV {pct(kv.used_tokens / kv.capacity_tokens)}" if kv and kv.capacity_tokens else "KV —"
    if name == "capture":
        if state.failed:
            return "failed"
        if state.info is None:
            return "loading"
        passes = list(state.capture.values())
        if (
            state.recapture_pending is not None
            or any(c.finished is None for c in passes)
            or any(phase not in state.capture for phase in state.planned_phases())
        ):
            done = sum(len(c.costs) for c in passes)
            return f"capturing {done}/{sum(c.total for c in passes)}"
        if any(c.failed for c in passes):
            return "✗ failures"
        return "✓" if passes else "eager only"
    return f"{hints.streaming} streaming" if hints.streaming else ""


class ViewBar(Static):
    """`` 1 steps │ 2 memory KV 32% │ 3 capture ✓ │ 4 prompts `` with the active tab lit and the
    hidden ones' headlines."""

    DEFAULT_CSS = """
    ViewBar {
        height: 1;
        background: $panel;
        color: $foreground;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    def update_view(self, state: DashboardState, views: Sequence[str], active: str, hints: ViewHints) -> None:
        parts: list[Content] = []
        for name, key, title in VIEWS:
            if name not in views:
                continue
            if name == active:  # no headline: the view itself shows
                tab = Content.from_markup("[reverse b] [$accent]$k[/] $t [/]", k=key, t=title)
            else:
                tab = Content.from_markup(
                    f"[@click=app.show_view('{name}')] [$accent]$k[/] $t [$text-muted]$h[/] [/]",
                    k=key,
                    t=title,
                    h=view_headline(name, state, hints),
                )
            parts.append(tab)
        set_content(self, Content("│").join(parts))
