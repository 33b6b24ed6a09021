"""Where we are in a replayed trace: play/pause, speed, time and event position, a progress bar, and
the keys that move it, the way back to the live engine included when one runs behind the replay.

The keys have a row of their own under the position, so none of them is cut off at 80 columns.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.widgets import Label, ProgressBar

from ..sessions.base import ReplayControls
from .panel import drawable

KEYS = "←/→ 5s · shift+←/→ 1 event · +/- speed · space pause"
BACK_TO_LIVE = " · l back to live"


def replay_keys(live_behind: bool) -> Content:
    """The replay's keys; with a live engine behind the replay, the one that goes back to it."""
    if not live_behind:
        return Content(KEYS)
    return Content(KEYS) + Content.from_markup("[b $accent]$k[/]", k=BACK_TO_LIVE)


class ReplayBar(Vertical):
    """Shown only in replay mode; ←/→ seek 5 s, shift+←/→ one event, +/- speed, l back to live."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.live_behind = False
        """A live engine keeps running behind the replay (a trace opened from the dashboard)."""

    def compose(self) -> ComposeResult:
        with Horizontal(id="replay-top"):
            yield Label(id="replay-label")
            yield ProgressBar(total=1, show_eta=False, show_percentage=False, id="replay-progress")
        yield Label(replay_keys(False), id="replay-keys")

    def update_view(self, session: ReplayControls) -> None:
        state = "[$warning]❚❚ paused[/]" if session.paused else "[$success]▶ playing[/]"
        if session.finished and not session.paused:
            state = "[$text-muted]■ end[/]"
        if not drawable(self):  # a timer tick while the app shuts down, after the children were removed
            return
        label = self.query_one("#replay-label", Label)
        progress = self.query_one(ProgressBar)
        keys = self.query_one("#replay-keys", Label)
        label.update(
            Content.from_markup(
                f"{state} $speed  $pos / $dur  event $cur/$tot",
                speed=f"{session.speed:g}x",
                pos=f"{session.position:7.1f}s",
                dur=f"{session.duration:.1f}s",
                cur=f"{session.cursor:,}",
                tot=f"{session.total:,}",
            )
        )
        keys.update(replay_keys(self.live_behind))
        progress.update(total=max(session.duration, 1e-9), progress=session.position)
