"""The dashboard's main screen: what goes where, at every terminal size.

Two layouts, picked from the terminal size on every resize (like btop and htop, nothing is cut off
silently):

* **wide** (at least ``COMPACT_WIDTH`` x ``COMPACT_HEIGHT``): a column of capture, ledger, KV pool,
  parity and device panels beside the steps panel, the prompt console below. The column is wider on
  a roomy terminal and the console taller on a tall one.
* **compact** (anything smaller, down to 80x24): one view at a time (steps · memory · capture ·
  prompts), switched with 1-4 or a click on the view bar, which also shows each hidden view's
  headline number.

A panel is shown when it is wanted (the parity panel only while checks run, the console only with a
live engine), not hidden from the palette, and, in compact mode, part of the current view. Whatever
is hidden, the rest reflows: an empty column goes, the steps panel takes its width, the console
takes the height. One method (``reflow``) decides all of it.
"""

from __future__ import annotations

from typing import Optional

from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.geometry import Size
from textual.message import Message
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer

from ..state import DashboardState
from ..widgets.capture_panel import CapturePanel
from ..widgets.device_panel import DevicePanel
from ..widgets.kv_panel import KVPanel
from ..widgets.ledger_panel import LedgerPanel
from ..widgets.panel import Panel, drawable
from ..widgets.parity_panel import ParityPanel
from ..widgets.prompt_console import PromptConsole
from ..widgets.replay_bar import ReplayBar
from ..widgets.status_line import StatusLine
from ..widgets.steps_panel import StepsPanel
from ..widgets.view_bar import VIEWS, ViewBar, ViewHints

LEFT_PANELS = ("capture", "ledger", "kv", "parity", "device")
PANELS = (*LEFT_PANELS, "steps", "console")
VIEW_PANELS: dict[str, tuple[str, ...]] = {
    "steps": ("steps",),
    "memory": ("ledger", "kv"),
    "capture": ("capture", "parity", "device"),
    "prompt": ("console",),
}


class DashboardScreen(Screen[None]):
    """Status line, view bar (compact), replay bar (replays), the panels, the console, the footer."""

    COMPACT_WIDTH = 120
    """Below this many columns the steps table and the left column do not fit side by side."""
    COMPACT_HEIGHT = 38
    """Below this many rows the left column's panels and a usable console do not fit one above the other."""
    ROOMY_WIDTH = 160
    """From here the left column gets its full width (ledger bars, device lines unshortened)."""
    TALL_HEIGHT = 46
    """From here the prompt console gets more rows."""
    SHORT_HEIGHT = 30
    """Below this the steps panel drops its replay-time sparkline (the caption keeps the numbers)."""
    AUTO_FOCUS = None  # the app gives the prompt the focus once it knows the engine takes prompts

    def __init__(self, label: str, *, poll_device: bool = True, animate: bool = True) -> None:
        super().__init__(id="dashboard")
        self.session_label = label
        self.poll_device = poll_device
        self.animate = animate
        self.compact = False
        self.view = "steps"
        self.hidden: set[str] = set()  # hidden from the palette
        self.replay = False
        self._size: Optional[Size] = None

    def compose(self) -> ComposeResult:
        # references kept as they are made: the app renders into them from its own mount on, and a
        # query would search whichever screen (a dialog) is on top
        self.status_line = StatusLine(self.session_label, id="status")
        self.view_bar = ViewBar(id="views")
        self.replay_bar = ReplayBar(id="replay-bar")
        self.device_panel = DevicePanel(polling=self.poll_device, id="device")
        self.prompt_console = PromptConsole(blink=self.animate, id="console")
        self.panels: list[Panel] = [
            CapturePanel(self.session_label, id="capture"),
            LedgerPanel(id="ledger"),
            KVPanel(id="kv"),
            ParityPanel(id="parity"),
            StepsPanel(id="steps"),
        ]
        capture, ledger, kv, parity, steps = self.panels
        self._parity = parity
        yield self.status_line
        yield self.view_bar
        yield self.replay_bar
        with Horizontal(id="main") as self._main:
            with VerticalScroll(id="left") as self._left:
                yield capture
                yield ledger
                yield kv
                yield parity
                yield self.device_panel
            yield steps
        yield self.prompt_console
        yield Footer()

    class Ready(Message):
        """The panels exist: the app may start rendering into them."""

    def on_mount(self) -> None:
        self.fit(self.app.size)
        self.post_message(self.Ready())

    # ------------------------------------------------------------------ size
    def on_resize(self, event: object) -> None:
        self.fit(self.size if self.size.area else self.app.size)

    def fit(self, size: Size) -> None:
        """Pick the layout for ``size`` (a no-op when it is the one already in use)."""
        if size == self._size:
            return
        self._size = size
        width, height = size
        was_compact = self.compact
        self.compact = width < self.COMPACT_WIDTH or height < self.COMPACT_HEIGHT
        if self.compact and not was_compact and self._typing():
            self.view = "prompt"  # a terminal that shrinks while the prompt has the focus keeps it in sight
        self.set_class(self.compact, "-compact")
        self.set_class(width >= self.ROOMY_WIDTH, "-roomy")
        self.set_class(height >= self.TALL_HEIGHT, "-tall")
        self.set_class(height < self.SHORT_HEIGHT, "-short")
        self.reflow()

    # ------------------------------------------------------------------ what shows
    def widget(self, name: str) -> Widget:
        return self.query_one(f"#{name}")

    def wanted(self, name: str) -> bool:
        """Whether a panel has anything to show at all (before the palette and the view decide)."""
        if name == "console":
            return not self.replay
        if name == "parity":
            return self._parity.wanted
        return True

    def available_views(self) -> list[str]:
        """Views with at least one panel to show."""
        return [v for v, *_ in VIEWS if any(n not in self.hidden and self.wanted(n) for n in VIEW_PANELS[v])]

    def reflow(self) -> None:
        """Show, hide and size the panels for the layout, the view and the palette's choices."""
        if not drawable(self):  # a panel's WantedChanged can arrive while the screen is being removed
            return
        if self.compact:
            views = self.available_views()
            if views and self.view not in views:
                self.view = views[0]
        shown = {}
        for name in PANELS:
            on = name not in self.hidden and self.wanted(name)
            if self.compact:
                on = on and name in VIEW_PANELS[self.view]
            shown[name] = on
            self.widget(name).display = on
        left = any(shown[n] for n in LEFT_PANELS)
        self._left.display = left
        self._left.set_class(not shown["steps"], "-fill")
        self._main.display = left or shown["steps"]
        self.prompt_console.set_class(not self._main.display, "-fill")
        self.view_bar.display = self.compact
        self.replay_bar.display = self.replay
        focused = self.focused
        if focused is not None and not all(
            node.display for node in focused.ancestors_with_self if isinstance(node, Widget)
        ):
            self.set_focus(None)  # a hidden input would take the keys typed next, out of sight

    def _typing(self) -> bool:
        """The focus is in the prompt console (the prompt, or a sampling field)."""
        focused = self.focused
        return focused is not None and self.prompt_console in focused.ancestors_with_self

    def show_view(self, name: str) -> bool:
        """Switch the compact layout to ``name``; False when it has nothing to show."""
        if name not in self.available_views():
            return False
        self.view = name
        self.reflow()
        return True

    def focus_prompt(self) -> bool:
        """Give the prompt input the focus now (the prompt view in the compact layout); False when
        there is no prompt console to type in (a replay, or hidden from the palette).

        ``Screen.set_focus``, not ``Widget.focus``: the latter waits for the next message loop turn,
        and keys already queued behind the one that asked (a user typing fast) would reach the app's
        single-key bindings instead of the prompt."""
        if self.compact and self.view != "prompt":
            self.show_view("prompt")
        if not self.prompt_console.display:
            return False
        self.set_focus(self.prompt_console.prompt_input)
        return True

    def toggle_panel(self, name: str) -> None:
        if name not in PANELS:
            return
        self.hidden ^= {name}
        if self.compact and name not in self.hidden:
            self.view = next(v for v, panels in VIEW_PANELS.items() if name in panels)
        self.reflow()

    def set_replay(self, replay: bool) -> None:
        self.replay = replay
        self.set_class(replay, "-replay")
        self.reflow()

    def on_panel_wanted_changed(self, _message: Panel.WantedChanged) -> None:
        self.reflow()

    def update_view_bar(self, state: DashboardState) -> None:
        if self.compact:
            hints = ViewHints(streaming=self.prompt_console.streaming)
            self.view_bar.update_view(state, self.available_views(), self.view, hints)
