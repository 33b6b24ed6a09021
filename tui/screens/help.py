"""Help (``?`` / F1): every key, what each panel is for, and every number explained.

The keys come from the live binding table and the explanations from :mod:`graphtop.tui.explain` (the
same texts the panels show on hover), so none of it can go stale.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from ..explain import FALLBACK_REASONS, LEDGER_ROWS, STATUS_ITEMS

PANELS = (
    ("graph capture", "model load, then per phase/bucket capture progress with time and memory; the engine "
                      "serves while it captures"),
    ("memory ledger", "weights, KV pool, decode/prefill graphs, reserve, free (c: per-bucket costs)"),
    ("KV pool", "tokens used of capacity, running/queued requests, use over time on a 0-100 % scale"),
    ("graph parity", "graph steps re-run eagerly and compared (palette or --parity-every); red on a mismatch"),
    ("device", "GPU memory/util/power via NVML, host CPU/RAM via psutil (1 Hz)"),
    ("steps", "recent steps, replay-time sparkline, bucket hits with padding, eager reasons"),
    ("prompt console", "send prompts (several at once), sampling row, ↑/↓ history; the last 50 requests stay "
                       "to scroll back through (page up/down)"),
)

LAYOUT = ("Below 120 columns or 38 rows one view shows at a time: 1 steps · 2 memory · 3 capture · "
          "4 prompts (the bar under the status line names each hidden view's headline number). "
          "Wider and taller, everything shows at once. The palette hides or shows single panels; "
          "the others take their room.")


def help_lines(bindings: list[Binding], key_display) -> list[Content]:  # type: ignore[no-untyped-def]
    """The help text, one Content per line (``key_display`` renders a key as the footer does)."""
    lines = [Content.from_markup("[b]keys[/b]")]
    seen = set()
    for b in bindings:
        if b.id in seen or not b.description:
            continue
        seen.add(b.id)
        keys = ", ".join(key_display(Binding(k.strip(), "")) for k in b.key.split(","))
        lines.append(Content.from_markup("  [$accent]$k[/] $d [$text-muted]— $t[/]",
                                         k=f"{keys:<16}", d=b.description, t=b.tooltip))
    lines.append(Content.from_markup(
        "  [$accent]$k[/] command palette [$text-muted]— recapture, parity, export/open trace, screenshot, "
        "panels, themes[/]", k=f"{'ctrl+p':<16}"))
    lines += [Content(""), Content.from_markup("[b]layout[/b]"), Content("  " + LAYOUT), Content("")]
    lines.append(Content.from_markup("[b]panels[/b]"))
    for name, what in PANELS:
        lines.append(Content.from_markup("  [$primary]$n[/] $w", n=f"{name:<16}", w=what))
    lines += [Content(""), Content.from_markup("[b]status line[/b] [$text-muted](left to right)[/]")]
    for name, what in STATUS_ITEMS:
        lines.append(Content.from_markup("  [$primary]$n[/] $w", n=f"{name:<16}", w=what))
    lines += [Content(""), Content.from_markup(
        "[b]eager fallback reasons[/b] [$text-muted](why a step ran without a graph; hover one in the steps "
        "panel)[/]")]
    for reason, ex in FALLBACK_REASONS.items():
        lines.append(Content.from_markup("  [$warning]$r[/]", r=reason))
        lines.append(Content.from_markup("      $m [$text-muted]→ $a[/]", m=ex.meaning, a=ex.action))
    lines += [Content(""), Content.from_markup("[b]memory ledger rows[/b] [$text-muted](hover one in the panel)[/]")]
    for row, ex in LEDGER_ROWS.items():
        lines.append(Content.from_markup("  [$primary]$n[/] $m [$text-muted]→ $a[/]", n=f"{row:<16}", m=ex.meaning,
                                         a=ex.action))
    lines.append(Content.from_markup("  [$text-muted]on CPU, free is not applicable: host memory has no device "
                                     "limit[/]"))
    return lines


class HelpScreen(ModalScreen[None]):
    """Keys, layout, panels, the status line, fallback reasons and ledger rows; scrolls."""

    AUTO_FOCUS = "VerticalScroll"  # arrows and page keys scroll at once
    BINDINGS = [
        Binding("escape,question_mark,f1,q", "dismiss", "Close", id="help.close", tooltip="Back to the dashboard"),
    ]

    def compose(self) -> ComposeResult:
        lines = help_lines(list(self.app.BINDINGS), self.app.get_key_display)  # type: ignore[arg-type]
        with Vertical(id="help-box", classes="modal-box"):
            yield Label("graphtop help", classes="modal-title")
            with VerticalScroll(id="help-scroll"):
                yield Static(Content("\n").join(lines), id="help-text")
            yield Label("↑/↓ scroll · escape closes", classes="modal-hint")

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)
