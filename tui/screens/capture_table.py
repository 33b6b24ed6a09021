"""Per-bucket capture cost (time, memory, ok/failed) on demand, as a sortable DataTable modal.

Kept off the main screen because it is only needed when choosing buckets, and a long bucket list
would crowd out the live panels.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable, Label

from ..fmt import human_bytes, secs
from ..state import DashboardState
from .dialog import Dialog


class CaptureTableScreen(Dialog[None]):
    """Every bucket of the latest capture of each phase, plus failures with their reasons."""

    AUTO_FOCUS = "DataTable"  # arrows move through the rows at once
    BINDINGS = [
        Binding("escape,c,q", "dismiss", "Close", id="capture_table.close", tooltip="Back to the dashboard"),
    ]

    def __init__(self, state: DashboardState) -> None:
        super().__init__()
        self.state = state

    def compose(self) -> ComposeResult:
        with Vertical(id="capture-table-box", classes="modal-box"):
            yield Label("per-bucket capture cost", classes="modal-title")
            yield DataTable(id="capture-table", zebra_stripes=True, cursor_type="row")
            yield Label("↑/↓ rows · escape closes", classes="modal-hint")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("phase", "bucket", "time", "memory", "status")
        rows = 0
        for phase in ("decode", "prefill"):
            cap = self.state.capture.get(phase)
            if cap is None:
                continue
            for c in cap.costs:
                status = "ok" if c.ok else f"failed: {c.failure_reason or 'failed'}"
                table.add_row(phase, c.bucket, secs(c.seconds), human_bytes(c.memory_bytes), status)
                rows += 1
        if not rows:
            table.add_row("—", "—", "—", "—", "nothing captured yet")

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)
