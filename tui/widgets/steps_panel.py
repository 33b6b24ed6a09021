"""Live steps: recent-steps table, replay-time sparkline, bucket-hit histogram, fallback reasons."""

from __future__ import annotations

import statistics

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.content import Content
from textual.widgets import Label, Sparkline

from ..fmt import ms, pct
from ..state import DashboardState
from .bucket_histogram import BucketHistogram
from .fallback_list import FallbackList
from .panel import Panel, set_content
from .steps_table import StepsTable


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile; enough for a sparkline caption."""
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


class StepsPanel(Panel):
    """What the graphs are doing right now."""

    AREAS = ("steps", "hist", "capture")
    TITLE = "steps"
    MIN_INTERVAL = 0.25  # the table at 4 Hz while steps stream in: plenty to read
    SUMMARY_INTERVAL = 1.0
    """The caption, sparkline, histogram and fallbacks aggregate hundreds of steps; redrawing them
    once a second reads just as live and costs a quarter of the GIL of doing it with the table."""
    _summary_at = float("-inf")

    _widgets: tuple[StepsTable, Label, Sparkline, BucketHistogram, FallbackList] | None = None

    def compose(self) -> ComposeResult:
        yield StepsTable(id="steps-table")
        yield Label(id="replay-caption")
        yield Sparkline([], id="replay-spark")
        with Horizontal(id="steps-bottom"):
            yield BucketHistogram(id="bucket-hist")
            yield FallbackList(id="fallbacks")

    def render_state(self, state: DashboardState) -> bool:
        if self._widgets is None:  # looked up once: a query per render is a DOM walk
            self._widgets = (
                self.query_one(StepsTable),
                self.query_one("#replay-caption", Label),
                self.query_one("#replay-spark", Sparkline),
                self.query_one(BucketHistogram),
                self.query_one(FallbackList),
            )
        table, caption, spark, hist, fallbacks = self._widgets
        table.update_view(state)
        now = self.render_now
        if now is not None:
            if now - self._summary_at < self.SUMMARY_INTERVAL - self.JITTER:
                return False
            self._summary_at = now
        replay = list(state.replay_ms)
        if replay:
            text = Content.from_markup(
                "replay ms [$text-muted](last $n)[/] p50 [b]$p50[/b] · p99 [b]$p99[/b]",
                n=str(len(replay)),
                p50=ms(percentile(replay, 0.5)),
                p99=ms(percentile(replay, 0.99)),
            )
            slowest = state.slowest_rank()
            if slowest is not None:  # a step waits for its slowest rank: ahead of what the header repeats
                text += Content.from_markup(" · slowest rank [b]$r[/b] $m", r=str(slowest[0]), m=ms(slowest[1]))
            text += Content.from_markup(
                " · mean $mean · graph hits [$success]$hit[/] of $steps steps",
                mean=ms(statistics.fmean(replay)),
                hit=pct(state.hit_rate()),
                steps=f"{state.total_steps:,}",
            )
            set_content(caption, text)
        else:
            set_content(caption, Content.from_markup("[$text-muted]replay ms — no graph replays yet[/]"))
        spark.data = replay  # a reactive: an equal list does not repaint
        hist.update_view(state)
        fallbacks.update_view(state)
        return True
