"""Where device memory went: weights (of them the experts', for a mixture of experts), KV pool, decode
graphs, prefill graphs, reserve, free.

Graph memory is the cost side of every bucket you add; seeing it next to the KV pool it competes
with is the point of this panel. ``c`` opens the per-bucket table. On CPU there is no device to be
full: "free" reads as not applicable there, never as a zero that would look like no headroom.
Hovering a row explains it.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.content import Content

from graphtop.engine.telemetry.events import MemoryLedger
from graphtop.engine.trace_tools.ledger_words import FREE_ON_CPU, free_applies

from ..explain import explain_ledger_row
from ..fmt import bar, human_bytes
from ..state import DashboardState
from .panel import Panel
from .tipped_lines import TippedLines

ROWS = (
    ("weights", "weights", "$secondary"),
    ("experts", "experts", "$secondary"),
    ("KV pool", "kv_pool", "$primary"),
    ("decode graphs", "decode_graphs", "$accent"),
    ("prefill graphs", "prefill_graphs", "$accent"),
    ("reserve", "activation_reserve", "$text-muted"),
    ("free", "free", "$success"),
)


def rows_of(ledgers: list[MemoryLedger]) -> tuple[tuple[str, str, str], ...]:
    """The rows to show: "experts" (a part of the weights) only where some ledger has expert weights."""
    return ROWS if any(led.experts for led in ledgers) else tuple(r for r in ROWS if r[1] != "experts")


class LedgerPanel(Panel):
    """The MemoryLedger as bars against the device total."""

    AREAS = ("ledger",)
    TITLE = "memory ledger"

    def compose(self) -> ComposeResult:
        yield TippedLines(id="ledger-body")

    def render_state(self, state: DashboardState) -> None:
        led = state.ledger
        body = self.query_one("#ledger-body", TippedLines)
        if led is None:
            body.show([Content.from_markup("[$text-muted]waiting for the memory plan…[/]")])
            return
        if len(state.ledgers) > 1:
            rows = rows_of(list(state.ledgers.values()))
            body.show(
                rank_columns(state), [None, *(explain_ledger_row(n, device=led.device).line(n) for n, _, _ in rows)]
            )
            return
        cpu = not free_applies(led.device)
        rows = rows_of([led])
        total = led.total or sum(getattr(led, attr) for _, attr, _ in rows if attr != "experts") or 1
        lines, tips = [], []
        for name, attr, style in rows:
            value = getattr(led, attr)
            tips.append(explain_ledger_row(name, device=led.device).line(name))
            if name == "free" and cpu:
                lines.append(Content.from_markup("$name [$text-muted]$na[/]", name=f"{name:<14}", na=FREE_ON_CPU))
                continue
            lines.append(
                Content.from_markup(
                    f"$name [{style}]$bar[/] $value $pct",
                    name=f"{name:<14}",
                    bar=bar(value / total, 10),
                    value=f"{human_bytes(value):>9}",
                    pct=f"{100 * value / total:5.1f}%",
                )
            )
        where = "host memory used" if cpu else "total"
        lines.append(
            Content.from_markup(
                "[$text-muted]$dev $w $t · [b]c[/b] per-bucket costs[/]",
                dev=led.device,
                w=where,
                t=human_bytes(led.total),
            )
        )
        tips.append("c opens each captured bucket's capture time and memory")
        body.show(lines, tips)


def rank_columns(state: DashboardState) -> list[Content]:
    """Tensor parallel: the ledger of every rank side by side, one column per rank (free on a CPU rank
    reads n/a, as in the single-device view)."""
    ranks = sorted(state.ledgers)
    header = [Content.from_markup("[b]$r[/b]", r=f"{'rank ' + str(r):>9}") for r in ranks]
    lines = [Content(" " * 14) + Content(" ").join(header)]
    for name, attr, style in rows_of([state.ledgers[r] for r in ranks]):
        cells = []
        for r in ranks:
            led = state.ledgers[r]
            value = "n/a" if name == "free" and led.device.startswith("cpu") else human_bytes(getattr(led, attr))
            cells.append(Content.from_markup(f"[{style}]$v[/]", v=f"{value:>9}"))
        lines.append(Content(f"{name:<14}") + Content(" ").join(cells))
    lines.append(
        Content.from_markup("[$text-muted]$n ranks, one device each · [b]c[/b] per-bucket costs[/]", n=str(len(ranks)))
    )
    return lines
