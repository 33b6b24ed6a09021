"""Where we are in a replayed trace: play/pause, speed, time and event position, a progress bar."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.content import Content
from textual.css.query import NoMatches
from textual.widgets import Label, ProgressBar

from ..sessions.base import ReplayControls


class ReplayBar(Horizontal):
    """Shown only in replay mode; ←/→ seek 5 s, shift+←/→ one event, +/- speed."""

    def compose(self) -> ComposeResult:
        yield Label(id="replay-label")
        yield ProgressBar(total=1, show_eta=False, show_percentage=False, id="replay-progress")
        yield Label("←/→ 5s · shift+←/→ 1 event · +/- speed · space pause", id="replay-keys")

    def update_view(self, session: ReplayControls) -> None:
        state = "[$warning]❚❚ paused[/]" if session.paused else "[$success]▶ playing[/]"
        if session.finished and not session.paused:
            state = "[$text-muted]■ end[/]"
        try:
            label = self.query_one("#replay-label", Label)
            progress = self.query_one(ProgressBar)
        except NoMatches:  # a timer tick while the app shuts down, after the children were removed
            return
        label.update(
            Content.from_markup(
                f"{state} $speed  $pos / $dur  event $cur/$tot",
                speed=f"{session.speed:g}x", pos=f"{session.position:7.1f}s", dur=f"{session.duration:.1f}s",
                cur=f"{session.cursor:,}", tot=f"{session.total:,}",
            )
        )
        progress.update(total=max(session.duration, 1e-9), progress=session.position)
