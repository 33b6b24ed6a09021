"""KV pool: capacity, used, running, queued — a gauge for now and a sparkline for the trend.

A pool near full means queued requests and preemption; a pool that never fills means memory that
could have gone to more graph buckets. Both are worth seeing at a glance.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.content import Content
from textual.widgets import ProgressBar, Sparkline, Static

from .panel import Panel
from .state import DashboardState


class KVPanel(Panel):
    """Numbers on top, a usage gauge, then usage history."""

    AREAS = ("kv",)
    TITLE = "KV pool"

    def compose(self) -> ComposeResult:
        yield Static(id="kv-body")
        yield ProgressBar(total=1, show_eta=False, id="kv-gauge")
        yield Sparkline([], id="kv-spark")

    def render_state(self, state: DashboardState) -> None:
        kv = state.kv
        body = self.query_one("#kv-body", Static)
        gauge = self.query_one("#kv-gauge", ProgressBar)
        if kv is None:
            body.update(Content.from_markup("[$text-muted]waiting for the KV pool…[/]"))
            gauge.update(total=1, progress=0)
            return
        max_running = f"/{kv.max_running}" if kv.max_running else ""
        queued_style = "$warning" if kv.queued else "$text-muted"
        body.update(
            Content.from_markup(
                f"[b]$used[/b] / $cap tokens · page $page\nrunning [b]$run[/b]$maxr · [{queued_style}]queued $q[/]",
                used=f"{kv.used_tokens:,}", cap=f"{kv.capacity_tokens:,}", page=str(kv.page_size),
                run=str(kv.running), maxr=max_running, q=str(kv.queued),
            )
        )
        gauge.update(total=max(kv.capacity_tokens, 1), progress=kv.used_tokens)
        self.query_one("#kv-spark", Sparkline).data = list(state.kv_used)
