"""Help (``?`` / F1): every key with what it does, and what each panel is for."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Label, Static

PANELS = (
    ("graph capture", "model load, then per phase/bucket capture progress with time and memory; the engine serves while it captures"),
    ("memory ledger", "weights, KV pool, decode/prefill graphs, reserve, free (c: per-bucket costs)"),
    ("KV pool", "tokens used of capacity, running/queued requests, usage trend"),
    ("graph parity", "graph steps re-run eagerly and compared (palette or --parity-every); red on a mismatch"),
    ("device", "GPU memory/util/power via NVML, host CPU/RAM via psutil (1 Hz)"),
    ("steps", "recent steps, replay-time sparkline, bucket hits with padding, eager reasons"),
    ("prompt console", "send prompts (several at once), sampling row, ↑/↓ history"),
)


class HelpScreen(ModalScreen[None]):
    """Lists the app's bindings (from the live binding table, so it never goes stale)."""

    BINDINGS = [
        Binding("escape,question_mark,f1,q", "dismiss", "Close", id="help.close", tooltip="Back to the dashboard"),
    ]

    def compose(self) -> ComposeResult:
        lines = [Content.from_markup("[b]keys[/b]")]
        seen = set()
        for binding in self.app.BINDINGS:
            b = binding if isinstance(binding, Binding) else Binding(*binding)
            if b.id in seen or not b.description:
                continue
            seen.add(b.id)
            keys = ", ".join(self.app.get_key_display(Binding(k.strip(), "")) for k in b.key.split(","))
            lines.append(Content.from_markup("  [$accent]$k[/] $d [$text-muted]— $t[/]",
                                             k=f"{keys:<16}", d=b.description, t=b.tooltip))
        lines.append(Content.from_markup("  [$accent]$k[/] command palette [$text-muted]— recapture, export/open trace, toggle panels, themes[/]",
                                         k=f"{'ctrl+p':<16}"))
        lines.append(Content(""))
        lines.append(Content.from_markup("[b]panels[/b]"))
        for name, what in PANELS:
            lines.append(Content.from_markup("  [$primary]$n[/] $w", n=f"{name:<16}", w=what))
        lines.append(Content(""))
        lines.append(Content.from_markup(
            "[$error]EMULATED[/] in the status line means the graph backend only emulates CUDA graphs: "
            "its replay times are not real graph numbers."))
        with Vertical(id="help-box", classes="modal-box"):
            yield Label("graphtop help", classes="modal-title")
            with VerticalScroll():
                yield Static(Content("\n").join(lines))
            yield Label("escape closes", classes="modal-hint")

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)
