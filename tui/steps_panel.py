"""Live steps: recent-steps table, replay-time sparkline, bucket-hit histogram, fallback reasons."""

from __future__ import annotations

import statistics

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.content import Content
from textual.widgets import Label, Sparkline

from .bucket_histogram import BucketHistogram
from .fallback_list import FallbackList
from .fmt import ms, pct
from .panel import Panel
from .state import DashboardState
from .steps_table import StepsTable


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile; enough for a sparkline caption."""
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


class StepsPanel(Panel):
    """What the graphs are doing right now."""

    AREAS = ("steps", "hist", "capture")
    TITLE = "steps"

    def compose(self) -> ComposeResult:
        yield StepsTable(id="steps-table")
        yield Label(id="replay-caption")
        yield Sparkline([], id="replay-spark")
        with Horizontal(id="steps-bottom"):
            yield BucketHistogram(id="bucket-hist")
            yield FallbackList(id="fallbacks")

    def render_state(self, state: DashboardState) -> None:
        self.query_one(StepsTable).update_view(state)
        replay = list(state.replay_ms)
        caption = self.query_one("#replay-caption", Label)
        if replay:
            caption.update(
                Content.from_markup(
                    "replay ms [$text-muted]last $n[/] p50 [b]$p50[/b] p99 [b]$p99[/b] mean $mean · "
                    "hit [$success]$hit[/] of $steps steps",
                    n=str(len(replay)), p50=ms(percentile(replay, 0.5)), p99=ms(percentile(replay, 0.99)),
                    mean=ms(statistics.fmean(replay)), hit=pct(state.hit_rate()), steps=f"{state.total_steps:,}",
                )
            )
        else:
            caption.update(Content.from_markup("[$text-muted]replay ms — no graph replays yet[/]"))
        self.query_one("#replay-spark", Sparkline).data = replay
        self.query_one(BucketHistogram).update_view(state)
        self.query_one(FallbackList).update_view(state)
