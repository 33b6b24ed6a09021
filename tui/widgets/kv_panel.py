"""KV pool: capacity, used, running, queued — a gauge for now and a sparkline for the trend.

A pool near full means queued requests and preemption; a pool that never fills means memory that
could have gone to more graph buckets. Both are worth seeing at a glance.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.content import Content
from textual.widgets import ProgressBar, Static

from ..state import DashboardState
from .level_spark import LevelSparkline
from .panel import Panel, set_content


class KVPanel(Panel):
    """Numbers on top, a usage gauge, then usage history."""

    AREAS = ("kv",)
    TITLE = "KV pool"
    MIN_INTERVAL = 0.5  # KVPoolState arrives at up to 20 Hz; pool usage moves slowly, 2 Hz reads live

    _widgets: tuple[Static, ProgressBar, LevelSparkline] | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="kv-body")
        yield ProgressBar(total=1, show_eta=False, id="kv-gauge")
        spark = LevelSparkline(id="kv-spark")
        spark.tooltip = "KV pool use over time on a 0-100 % scale, newest on the right"
        yield spark

    def render_state(self, state: DashboardState) -> None:
        kv = state.kv
        if self._widgets is None:  # looked up once: a query per render is a DOM walk
            self._widgets = (
                self.query_one("#kv-body", Static),
                self.query_one("#kv-gauge", ProgressBar),
                self.query_one("#kv-spark", LevelSparkline),
            )
        body, gauge, spark = self._widgets
        if kv is None:
            set_content(body, Content.from_markup("[$text-muted]waiting for the KV pool…[/]"))
            gauge.update(total=1, progress=0)
            return
        max_running = f"/{kv.max_running}" if kv.max_running else ""
        queued_style = "$warning" if kv.queued else "$text-muted"
        set_content(
            body,
            Content.from_markup(
                f"used [b]$used[/b] / $cap tokens · page $page\n"
                f"running [b]$run[/b]$maxr · [{queued_style}]queued $q[/]",
                used=f"{kv.used_tokens:,}",
                cap=f"{kv.capacity_tokens:,}",
                page=str(kv.page_size),
                run=str(kv.running),
                maxr=max_running,
                q=str(kv.queued),
            ),
        )
        gauge.update(total=max(kv.capacity_tokens, 1), progress=kv.used_tokens)
        spark.data = tuple(state.kv_used)  # a reactive: an equal tuple does not repaint
