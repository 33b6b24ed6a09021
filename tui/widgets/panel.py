"""Base for the dashboard panels: re-render only when the state areas they show changed.

The UI timer calls ``update_view`` on every panel each tick; comparing a few revision counters is
what keeps that cheap when nothing happened. While the engine is busy the areas change on every
tick, so each panel also has ``MIN_INTERVAL``: the timer (``now`` given) re-renders it at most that
often. The UI shares the GIL with the engine thread, and a human reads a steps table no faster
than a few times a second. A throttled panel stays dirty and is drawn at its next due tick, so the
latest state always shows; direct calls (``now=None``: tests, key actions, mode switches) render at
once.
"""

from __future__ import annotations

from typing import ClassVar, Optional

from textual.containers import Vertical
from textual.content import Content
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Static

from ..safe_text import safe_content
from ..state import DashboardState


def set_content(widget: Static, content: Content) -> bool:
    """``widget.update(content)`` unless it already shows exactly that; False when skipped.

    Updating a Static re-renders it, and ``layout=True`` (Textual's default) also reflows the whole
    screen (a few ms). A relayout is only needed when the content's size may change it: its number
    of lines (the panels are ``height: auto``) or, for a ``width: auto`` widget such as a Label, its
    length.
    """
    content = safe_content(content)  # engine and remote text: no terminal controls reach the screen
    old: Optional[Content] = getattr(widget, "_graphtop_content", None)
    if old is not None and old.is_same(content):
        return False
    if old is None:
        layout = True
    else:
        layout = old.plain.count("\n") != content.plain.count("\n")
        width = widget.styles.width
        if not layout and width is not None and width.is_auto:
            layout = old.cell_length != content.cell_length
    widget._graphtop_content = content  # type: ignore[attr-defined]
    widget.update(content, layout=layout)
    return True


def drawable(widget: Widget) -> bool:
    """Whether ``widget`` is still in a running app: its children (composed once it was mounted) can be
    looked up and drawn into.

    The UI timer, a refresh callback or a message from a worker can run while the app shuts down (a
    test's shutdown prunes the screen without ``App.exit``, its timer still ticking; an exit's messages
    still queued): a query for a child then raises NoMatches. Every path that draws into children asks
    this first, the one place that knows how Textual says a node is going. The app renders only once
    its screen is mounted (``DashboardScreen.Ready``); a widget that can be told something before its
    own compose (the device panel) also checks that its children exist."""
    if not widget.is_attached:
        return False
    app = widget.app
    if not app.is_running or getattr(app, "_exit", False):
        return False
    return not any(getattr(widget, flag, False) for flag in ("_pruning", "_closing", "_closed"))


class Panel(Vertical):
    """A bordered panel bound to some areas of :class:`DashboardState`."""

    class WantedChanged(Message):
        """The panel started or stopped having something to show; the screen reflows the layout."""

    AREAS: ClassVar[tuple[str, ...]] = ()
    TITLE: ClassVar[str] = ""
    MIN_INTERVAL: ClassVar[float] = 0.0
    """Seconds between timer-driven re-renders (0: whenever the areas changed)."""
    JITTER: ClassVar[float] = 0.03
    """Timer ticks arrive a little early or late; without this slack a panel whose interval equals
    the tick period would render only every other tick."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=("panel " + (classes or "")).strip())
        self._seen: tuple[int, tuple[int, ...]] | None = None
        self._rendered_at = float("-inf")
        self.render_now: Optional[float] = None
        self.border_title = self.TITLE
        self.wanted = True
        """Whether there is anything to show (the screen decides whether it is shown: ``reflow``)."""

    def want(self, wanted: bool) -> None:
        if wanted != self.wanted:
            self.wanted = wanted
            self.post_message(self.WantedChanged())

    def update_view(self, state: DashboardState, *, force: bool = False, now: Optional[float] = None) -> bool:
        """Re-render from ``state`` if any of this panel's areas changed (and, with ``now``, if due)."""
        if not drawable(self):  # stays dirty: drawn once it can be
            return False
        revs = state.revs
        key = (id(state), tuple(revs[a] for a in self.AREAS))
        if not force:
            if key == self._seen:
                return False
            if now is not None and now - self._rendered_at < self.MIN_INTERVAL - self.JITTER:
                return False
        self._seen = key
        self.render_now = now
        if now is not None:
            self._rendered_at = now
        if self.render_state(state) is False:  # part of it deferred: stay dirty until drawn
            self._seen = None
        return True

    def render_state(self, state: DashboardState) -> Optional[bool]:  # pragma: no cover - abstract
        """Draw ``state``; return False if some part was deferred (``render_now`` says when this
        render happens: None for an immediate one, which must draw everything)."""
        raise NotImplementedError
