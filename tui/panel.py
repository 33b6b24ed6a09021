"""Base for the dashboard panels: re-render only when the state areas they show changed.

The UI timer calls ``update_view`` 15 times a second on every panel; comparing a few revision
counters is what keeps that cheap when nothing happened.
"""

from __future__ import annotations

from typing import ClassVar

from textual.containers import Vertical

from .state import DashboardState


class Panel(Vertical):
    """A bordered panel bound to some areas of :class:`DashboardState`."""

    AREAS: ClassVar[tuple[str, ...]] = ()
    TITLE: ClassVar[str] = ""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=("panel " + (classes or "")).strip())
        self._seen: tuple[int, tuple[int, ...]] | None = None
        self.border_title = self.TITLE

    def update_view(self, state: DashboardState, *, force: bool = False) -> None:
        """Re-render from ``state`` if any of this panel's areas changed since last time."""
        key = (id(state), tuple(state.revs[a] for a in self.AREAS))
        if not force and key == self._seen:
            return
        self._seen = key
        self.render_state(state)

    def render_state(self, state: DashboardState) -> None:  # pragma: no cover - abstract
        raise NotImplementedError
