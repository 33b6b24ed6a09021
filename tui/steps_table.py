"""The most recent steps, newest first: which bucket each hit, padding, path, why it fell back."""

from __future__ import annotations

from rich.text import Text
from typing import TYPE_CHECKING

from textual.widgets import DataTable

if TYPE_CHECKING:
    from graphtop.engine.events import StepEvent

from .fmt import ms, short
from .state import DashboardState

ROWS = 40
COLUMNS = ("step", "phase", "bs", "tok", "bucket", "pad", "path", "fallback", "replay ms", "host ms")


class StepsTable(DataTable):
    """Rebuilt from the state's step ring on change (40 rows: cheaper than diffing)."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, zebra_stripes=True, cursor_type="none", show_cursor=False)

    def on_mount(self) -> None:
        self.add_columns(*COLUMNS)

    def _style(self, name: str) -> str:
        """A theme colour resolved now (Rich cells cannot take $variables), so themes still apply."""
        return self.app.theme_variables.get(name, "")

    def _row(self, s: StepEvent) -> tuple:
        graph = s.path == "graph"
        path = Text("graph" if graph else "eager", style=self._style("success" if graph else "warning"))
        pad = s.padded if s.bucket is not None else None
        return (
            s.step,
            s.phase,
            s.batch_size,
            s.num_tokens,
            "—" if s.bucket is None else s.bucket,
            "—" if pad is None else f"{pad} ({s.padding_waste * 100:.0f}%)",
            path,
            Text(short(s.fallback_reason or "", 28), style=self._style("text-muted")),
            ms(s.replay_ms),
            ms(s.host_ms),
        )

    def update_view(self, state: DashboardState) -> None:
        steps = list(state.steps)[-ROWS:]
        self.clear()
        self.add_rows(self._row(s) for s in reversed(steps))
