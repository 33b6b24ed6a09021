"""Where device memory went: weights, KV pool, decode graphs, prefill graphs, reserve, free.

Graph memory is the cost side of every bucket you add; seeing it next to the KV pool it competes
with is the point of this panel. ``c`` opens the per-bucket table.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.content import Content
from textual.widgets import Static

from .fmt import bar, human_bytes
from .panel import Panel, set_content
from .state import DashboardState

ROWS = (
    ("weights", "weights", "$secondary"),
    ("KV pool", "kv_pool", "$primary"),
    ("decode graphs", "decode_graphs", "$accent"),
    ("prefill graphs", "prefill_graphs", "$accent"),
    ("reserve", "activation_reserve", "$text-muted"),
    ("free", "free", "$success"),
)


class LedgerPanel(Panel):
    """The MemoryLedger as bars against the device total."""

    AREAS = ("ledger",)
    TITLE = "memory ledger"

    def compose(self) -> ComposeResult:
        yield Static(id="ledger-body")

    def render_state(self, state: DashboardState) -> None:
        led = state.ledger
        body = self.query_one("#ledger-body", Static)
        if led is None:
            set_content(body, Content.from_markup("[$text-muted]waiting for the memory plan…[/]"))
            return
        if len(state.ledgers) > 1:
            set_content(body, rank_columns(state))
            return
        total = led.total or sum(getattr(led, attr) for _, attr, _ in ROWS) or 1
        lines = []
        for name, attr, style in ROWS:
            value = getattr(led, attr)
            lines.append(
                Content.from_markup(
                    f"$name [{style}]$bar[/] $value $pct",
                    name=f"{name:<14}", bar=bar(value / total, 12), value=f"{human_bytes(value):>9}",
                    pct=f"{100 * value / total:5.1f}%",
                )
            )
        lines.append(
            Content.from_markup(
                "[$text-muted]$dev total $t · [b]c[/b] per-bucket costs[/]", dev=led.device, t=human_bytes(led.total)
            )
        )
        set_content(body, Content("\n").join(lines))


def rank_columns(state: DashboardState) -> Content:
    """Tensor parallel: the ledger of every rank side by side, one column per rank."""
    ranks = sorted(state.ledgers)
    header = [Content.from_markup("[b]$r[/b]", r=f"{'rank ' + str(r):>9}") for r in ranks]
    lines = [Content(" " * 14) + Content(" ").join(header)]
    for name, attr, style in ROWS:
        cells = [Content.from_markup(f"[{style}]$v[/]", v=f"{human_bytes(getattr(state.ledgers[r], attr)):>9}")
                 for r in ranks]
        lines.append(Content(f"{name:<14}") + Content(" ").join(cells))
    lines.append(Content.from_markup("[$text-muted]$n ranks, one device each · [b]c[/b] per-bucket costs[/]",
                                     n=str(len(ranks))))
    return Content("\n").join(lines)
