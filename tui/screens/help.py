"""Help (``?`` / F1): every key, what each panel is for, and every number explained.

The keys come from the live binding table, only those that mean something in the current mode (one
meaning per key: ``q`` quits, or detaches from an engine that keeps running), and the explanations from
:mod:`graphtop.tui.explain` (the same texts the panels show on hover), so none of it can go stale.

Each entry is a term beside its text: the text wraps under itself, never under the term, so a line
broken on an 80-column terminal still reads as one entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.widget import Widget
from textual.widgets import Label, Static

from graphtop.engine.trace_tools.ledger_words import FREE_ON_CPU

from ..explain import FALLBACK_REASONS, LEDGER_ROWS, STATUS_ITEMS
from ..widgets.history_input import HistoryInput
from ..widgets.prompt_console import PromptConsole
from .dialog import Dialog

PANELS = (
    (
        "graph capture",
        "model load, then per phase/bucket capture progress with time and memory; the engine serves while it captures",
    ),
    ("memory ledger", "weights, KV pool, decode/prefill graphs, reserve, free (c: per-bucket costs)"),
    ("KV pool", "tokens used of capacity, running/queued requests, use over time on a 0-100 % scale"),
    ("graph parity", "graph steps re-run eagerly and compared (palette or --parity-every); red on a mismatch"),
    ("device", "GPU memory/util/power via NVML, host CPU/RAM via psutil (1 Hz)"),
    ("steps", "recent steps, replay-time sparkline, bucket hits with padding, eager reasons"),
    (
        "prompt console",
        "send prompts (several at once), sampling row, ↑/↓ history; the last 50 requests stay "
        "to scroll back through (page up/down)",
    ),
)

LAYOUT = (
    "Below 120 columns or 38 rows one view shows at a time: 1 steps · 2 memory · 3 capture · "
    "4 prompts (the bar under the status line names each hidden view's headline number; the first "
    "view is the prompt). Wider and taller, everything shows at once. The palette hides or shows "
    "single panels; the others take their room."
)

TYPING = (
    "With a live engine the prompt has the focus from the start: what you type is the prompt, "
    "letters included. Escape leaves it for the single-key shortcuts; / comes back."
)

KeyDisplay = Callable[[Binding], str]


@dataclass(frozen=True)
class Entry:
    """One help entry: a short ``term`` (a key, a panel, a row name) beside its ``text``; ``wide``: the
    term is too long for the term column and takes a line of its own, the text indented below."""

    term: Content
    text: Content
    wide: bool = False


@dataclass(frozen=True)
class Section:
    title: Content
    entries: tuple[Entry, ...] = ()
    paragraph: Optional[Content] = None


def key_entries(bindings: Iterable[Binding], key_display: KeyDisplay, applies: Callable[[str], bool]) -> list[Entry]:
    """One entry per action and description, keys joined (``^q, q``), for the actions ``applies`` says
    mean something in this mode, in the table's order."""
    rows: dict[tuple[str, str], tuple[list[str], str]] = {}
    for b in bindings:
        action = b.action.split("(", 1)[0]
        if not b.description or not applies(action):
            continue
        keys, tooltip = rows.setdefault((b.action, b.description), ([], b.tooltip))
        keys.extend(key_display(Binding(k.strip(), "")) for k in b.key.split(",") if k.strip())
    return [
        Entry(
            Content.styled(", ".join(keys), "$accent"),
            Content.from_markup("$d [$text-muted]— $t[/]", d=description, t=tooltip),
        )
        for (_, description), (keys, tooltip) in rows.items()
    ]


def help_sections(
    bindings: Iterable[Binding], key_display: KeyDisplay, applies: Callable[[str], bool], *, live: bool
) -> list[Section]:
    """The whole help, section by section (``live``: a live engine, whose prompt keys are listed too)."""
    keys = key_entries(bindings, key_display, applies)
    keys.append(
        Entry(
            Content.styled(key_display(Binding("ctrl+p", "")), "$accent"),
            Content.from_markup(
                "command palette [$text-muted]— recapture, parity, export/open trace, screenshot, panels, themes[/]"
            ),
        )
    )
    sections = [Section(Content.from_markup("[b]keys[/b]"), tuple(keys))]
    if live:
        typing = [Entry(Content.styled("enter", "$accent"), Content("Send the prompt (several can run at once)"))]
        typing += key_entries([*HistoryInput.BINDINGS, *PromptConsole.BINDINGS], key_display, lambda _: True)
        sections.append(Section(Content.from_markup("[b]typing a prompt[/b]"), tuple(typing), Content(TYPING)))
    sections.append(Section(Content.from_markup("[b]layout[/b]"), paragraph=Content(LAYOUT)))
    sections.append(
        Section(
            Content.from_markup("[b]panels[/b]"),
            tuple(Entry(Content.styled(n, "$primary"), Content(w)) for n, w in PANELS),
        )
    )
    sections.append(
        Section(
            Content.from_markup("[b]status line[/b] [$text-muted](left to right)[/]"),
            tuple(Entry(Content.styled(n, "$primary"), Content(w)) for n, w in STATUS_ITEMS),
        )
    )
    sections.append(
        Section(
            Content.from_markup(
                "[b]eager fallback reasons[/b] [$text-muted](why a step ran without a graph; hover one "
                "in the steps panel)[/]"
            ),
            tuple(
                Entry(
                    Content.styled(reason, "$warning"),
                    Content.from_markup("$m [$text-muted]→ $a[/]", m=ex.meaning, a=ex.action),
                    wide=True,
                )
                for reason, ex in FALLBACK_REASONS.items()
            ),
        )
    )
    ledger = [
        Entry(
            Content.styled(row, "$primary"), Content.from_markup("$m [$text-muted]→ $a[/]", m=ex.meaning, a=ex.action)
        )
        for row, ex in LEDGER_ROWS.items()
    ]
    sections.append(
        Section(
            Content.from_markup("[b]memory ledger rows[/b] [$text-muted](hover one in the panel)[/]"),
            tuple(ledger),
            Content.from_markup(
                '[$text-muted]on CPU, free reads "$na": host memory has no device limit[/]', na=FREE_ON_CPU
            ),
        )
    )
    return sections


def plain_text(sections: Iterable[Section]) -> str:
    """The help as plain text, one entry a line (what a test or a reader without the screen needs)."""
    lines: list[str] = []
    for section in sections:
        lines.append(section.title.plain)
        if section.paragraph is not None:
            lines.append(f"  {section.paragraph.plain}")
        lines += [f"  {e.term.plain}  {e.text.plain}" for e in section.entries]
    return "\n".join(lines)


def entry_widgets(entry: Entry) -> Iterable[Widget]:
    if entry.wide:
        yield Static(entry.term, classes="help-term -wide")
        yield Static(entry.text, classes="help-text -under")
        return
    yield Horizontal(
        Static(entry.term, classes="help-term"), Static(entry.text, classes="help-text"), classes="help-entry"
    )


class HelpScreen(Dialog[None]):
    """Keys, typing, layout, panels, the status line, fallback reasons and ledger rows; scrolls."""

    AUTO_FOCUS = "VerticalScroll"  # arrows and page keys scroll at once
    BINDINGS = [
        Binding("escape,question_mark,f1,q", "dismiss", "Close", id="help.close", tooltip="Back to the dashboard"),
    ]

    def __init__(self) -> None:
        super().__init__()
        app = self.app
        applies: Callable[[str], bool] = getattr(app, "applies_in_mode", lambda _action: True)
        live = getattr(getattr(app, "session", None), "kind", "live") == "live"
        self.sections = help_sections(list(app.BINDINGS), app.get_key_display, applies, live=live)

    @property
    def text(self) -> str:
        return plain_text(self.sections)

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box", classes="modal-box"):
            yield Label("graphtop help", classes="modal-title")
            with VerticalScroll(id="help-scroll"):
                for section in self.sections:
                    yield Static(section.title, classes="help-section")
                    if section.paragraph is not None:
                        yield Static(section.paragraph, classes="help-text -under")
                    for entry in section.entries:
                        yield from entry_widgets(entry)
            yield Label("↑/↓ scroll · escape closes", classes="modal-hint")

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)
