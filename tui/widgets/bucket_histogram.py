"""Bucket hits with the padding each bucket carried, since the last capture of its phase.

A bucket that is hit often with high padding is the one to split; a bucket never hit is graph
memory for nothing. Both show up here without opening the bucket editor.
"""

from __future__ import annotations

from textual.content import Content
from textual.widgets import Static

from ..fmt import bar
from ..state import DashboardState
from .panel import set_content

MAX_ROWS = 10
BAR = 8


class BucketHistogram(Static):
    """``decode     8 ██████░░░░  412  pad 12%`` per bucket, most-hit first per phase."""

    def update_view(self, state: DashboardState) -> None:
        stats = state.bucket_stats
        if not stats:
            set_content(self, Content.from_markup("[$text-muted]no graph hits yet[/]"))
            return
        top = max(s.count for s in stats.values()) or 1
        rows = sorted(stats.items(), key=lambda kv: (kv[0][0], -kv[1].count, kv[0][1]))[:MAX_ROWS]
        lines = [Content.from_markup("[$text-muted]bucket hits · padding[/]")]
        for (phase, bucket), st in rows:
            waste_style = "$error" if st.waste > 0.4 else "$warning" if st.waste > 0.15 else "$text-muted"
            lines.append(
                Content.from_markup(
                    f"$p $b [$success]$bar[/] $h [{waste_style}]pad $w[/]",
                    p=f"{phase[:3]}",
                    b=f"{bucket:>5}",
                    bar=bar(st.count / top, BAR),
                    h=f"{st.count:>5}",
                    w=f"{st.waste * 100:3.0f}%",
                )
            )
        hidden = len(stats) - len(rows)
        if hidden > 0:
            lines.append(Content.from_markup("[$text-muted]… $n more buckets[/]", n=str(hidden)))
        set_content(self, Content("\n").join(lines))
