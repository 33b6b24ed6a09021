"""The dashboard's everyday actions: quit, help, pause, prompt focus, views and panels, replay keys.

A mixin of :class:`~graphtop.tui.app.GraphtopApp`; the graph actions (buckets, recapture, parity)
and the file actions (traces, screenshots) have modules of their own.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable, Optional

from textual.app import App
from textual.screen import ModalScreen
from textual.widgets import Input

from .bindings import LIVE_ACTIONS, REPLAY_ACTIONS
from .screens.help import HelpScreen

if TYPE_CHECKING:
    from .screens.dashboard import DashboardScreen
    from .sessions.base import ReplayControls, Session
    from .state import DashboardState


class AppActions(App[int]):
    """Key and palette actions that only move the view around."""

    session: "Session"
    state: "DashboardState"
    live_session: Optional["Session"]
    live_state: Optional["DashboardState"]
    dashboard: "DashboardScreen"
    paused: bool
    animate: bool
    _stop: threading.Event

    if TYPE_CHECKING:  # GraphtopApp's

        def render_all(self, *, force: bool = False, now: Optional[float] = None) -> None: ...
        def render_status(self, *, force: bool = False) -> None: ...
        def pump(self, *, now: Optional[float] = None) -> int: ...
        def apply_mode(self) -> None: ...

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """What a key does here: its mode (``applies_in_mode``), no dashboard key over a dialog (it
        would act behind it; ctrl+q still quits), view keys only in the compact layout, "/" only away
        from the prompt and escape only where there is an input to leave (so the footer lists the
        keys that do something, and no more)."""
        if not self.applies_in_mode(action):
            return False
        if action in ("quit", "detach"):
            return True
        if isinstance(self.screen, ModalScreen):
            return False  # a dialog's own keys (escape: cancel) are the ones that apply
        if action == "show_view":
            return self.dashboard.compact
        if action == "focus_prompt":
            return not self.typing_in_prompt
        if action == "leave_input":
            return isinstance(self.focused, Input) or bool(self.screen.query("HelpPanel"))
        return True

    def applies_in_mode(self, action: str) -> bool:
        """One meaning per key in each mode: ``q`` quits, or detaches when the engine keeps running
        without this dashboard; replay keys only in a replay (back to live only with a live engine
        behind it); bucket editing and the prompt only with a live engine. The help screen lists the
        keys this says yes to."""
        replay = self.session.kind == "replay"
        if action in ("quit", "detach"):
            detaches = self.live_session is not None and self.live_session.detaches
            return (action == "detach") == detaches
        if action == "back_to_live":
            return replay and self.live_session is not None
        if action in REPLAY_ACTIONS:
            return replay
        if action in LIVE_ACTIONS:
            return not replay
        return True

    @property
    def typing_in_prompt(self) -> bool:
        """The prompt input has the focus (from the first frame, with a live engine)."""
        focused = self.focused
        return focused is not None and focused.id == "prompt"

    async def action_quit(self) -> None:
        self._stop.set()
        self.exit(0)

    async def action_detach(self) -> None:
        await self.action_quit()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_toggle_pause(self) -> None:
        replay = self.session.replay
        if replay is not None:
            replay.toggle_pause()
        else:
            self.paused = not self.paused
            if not self.paused:
                self.render_all(force=True)
        self.render_status(force=True)

    def action_focus_prompt(self) -> None:
        """ "/" asks for the prompt, so a console hidden from the palette comes back for it. The focus
        moves at once (``DashboardScreen.focus_prompt``): keys typed right after "/" are the prompt's."""
        dashboard = self.dashboard
        if "console" in dashboard.hidden:
            self.action_toggle_panel("console")
        if not dashboard.focus_prompt():
            self.notify("no prompt console: the engine takes no prompts here", severity="warning")

    def action_leave_input(self) -> None:
        """Escape: leave an input; close textual's key panel (palette → Keys) when it is open."""
        if self.screen.query("HelpPanel"):
            self.action_hide_help_panel()
        self.screen.set_focus(None)

    def action_show_view(self, name: str) -> None:
        if self.dashboard.show_view(name):
            self.render_all(force=True)
        else:  # a key that does nothing must say why
            self.notify(
                f"the {name} view has nothing to show: its panels are hidden (palette) or not in use",
                severity="warning",
            )

    def action_toggle_panel(self, name: str) -> None:
        self.dashboard.toggle_panel(name)
        self.render_all(force=True)

    # ------------------------------------------------------------------ replay keys
    def _seek(self, move: Callable[["ReplayControls"], object]) -> None:
        """Move a replay (a live session has none) and show where it is now."""
        replay = self.session.replay
        if replay is not None:
            move(replay)
            self.pump()

    def action_seek(self, seconds: float) -> None:
        self._seek(lambda replay: replay.seek(seconds))

    def action_seek_to(self, position: float) -> None:
        self._seek(lambda replay: replay.seek_to(position))

    def action_seek_events(self, n: int) -> None:
        self._seek(lambda replay: replay.seek_events(n))

    def action_speed(self, direction: int) -> None:
        replay = self.session.replay
        if replay is not None:
            replay.change_speed(direction)
            self.dashboard.replay_bar.update_view(replay)
