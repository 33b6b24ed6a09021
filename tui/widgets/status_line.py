"""One line that says what is running: model, device, dtype, attention and graph backends.

The EMULATED badge is its own widget with an $error background, not just a word in the line:
numbers from an emulated graph backend say nothing about real CUDA graphs, and nobody should be
able to miss that. Every number carries its label ("graph hits 88.3%"), and on a narrow terminal
the least telling parts go first (the demo note, dtype, attention, device, graph backends), so the
model and the hit rate always show. The tooltip says what each part means (``explain.STATUS_ITEMS``).
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.content import Content
from textual.widgets import Label, Static

from ..explain import STATUS_ITEMS
from ..fmt import pct
from ..safe_text import literal
from ..state import DashboardState
from .panel import drawable, set_content


class StatusLine(Horizontal):
    """Model · device · dtype · attention · graph backends, plus EMULATED / mode badges."""

    def __init__(self, label: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.session_label = label
        self._seen: tuple | None = None
        self._parts: list[tuple[int, Content]] = []
        self._legend = "\n".join(f"{name}: {what}" for name, what in STATUS_ITEMS)
        self.tooltip = self._legend

    def compose(self) -> ComposeResult:
        yield Label("graphtop", id="brand")
        yield Static(id="status-text")
        yield Label("EMULATED", id="badge-emulated", classes="badge")
        yield Label("", id="badge-mode", classes="badge")

    def on_mount(self) -> None:
        self.query_one("#badge-emulated").display = False
        self.query_one("#badge-mode").display = False

    def update_view(self, state: DashboardState, *, mode: str, dropped: int, force: bool = False) -> None:
        """``mode`` is '' (live), 'PAUSED', 'REPLAY', 'REPLAY · PAUSED', 'LOADING', or 'ENGINE GONE' / 'NO WORD
        FOR N S' (with ' · PAUSED' when paused) for a live engine that went away or quiet.

        Keyed on what the line shows (the hit rate as displayed, not the step count), so a busy
        engine whose hit rate holds steady costs no repaint at all.
        """
        if not drawable(self):  # a tick while the app mounts or shuts down: no badges to set
            return
        key = (
            id(state),
            state.revs["info"],
            pct(state.hit_rate()),
            state.emulated,
            mode,
            dropped,
            state.failed,
            state.live_advice,
        )
        if key == self._seen and not force:
            return
        self._seen = key
        info = state.info
        if info is None:
            what = "engine failed" if state.failed else f"loading {self.session_label}…"
            self._parts = [(0, Content.from_markup("[$text-muted]$what[/]", what=what))]
        else:
            # how the engine set itself up (backend choice, model kernels, packed weights): too long for
            # the line, so the tooltip carries it under the legend
            note = info.attention_backend_note.strip(" ·")
            self.tooltip = literal(self._legend + (f"\n\nsetup: {note}" if note else ""))
            device = " ".join(p for p in (info.device, info.device_name) if p)
            model = info.model.rstrip("/").rsplit("/", 1)[-1] if info.model else self.session_label
            # (priority, part) in display order: the highest priority numbers go first when short of room
            self._parts = [
                (0, Content.from_markup("[b]$m[/b]", m=model)),
                (0, Content.from_markup("graph hits [$success]$h[/]", h=pct(state.hit_rate()))),
                (1, Content.from_markup("[$accent]$a[/] [$text-muted](a)[/]", a=state.live_advice))
                if state.live_advice
                else (9, Content()),
                (0, Content.from_markup("[$warning]dropped events $n[/]", n=f"{dropped:,}"))
                if dropped
                else (9, Content()),
                (
                    3,
                    Content.from_markup(
                        "graphs decode [b]$d[/b] · prefill [b]$p[/b]",
                        d=info.decode_graph_backend or "eager",
                        p=info.prefill_graph_backend or "eager",
                    ),
                ),
                (2, Content(device)),
                (5, Content(info.dtype or "")),
                (4, Content.from_markup("attn [b]$a[/b]", a=info.attention_backend or "?")),
                (6, Content.from_markup("[$text-muted]demo model: random weights[/]")) if info.demo else (9, Content()),
            ]
        self._fit()
        self.query_one("#badge-emulated").display = state.emulated
        badge = self.query_one("#badge-mode", Label)
        badge.display = bool(mode)
        set_content(badge, Content(mode))
        badge.set_class("paused" in mode.lower(), "-paused")
        badge.set_class(mode.startswith(("ENGINE GONE", "NO WORD")), "-engine-lost")
        self.call_after_refresh(self._fit)  # the badges just took (or gave back) room

    def _fit(self) -> None:
        """Join the parts that fit the line's width, dropping the least telling ones first."""
        if not drawable(self):  # called after a refresh that came while the app shut down, its children gone
            return
        text_widget = self.query_one("#status-text", Static)
        room = (text_widget.size.width or self.app.size.width) - 2
        parts = [(prio, part) for prio, part in self._parts if part.cell_length]
        sep = Content(" │ ")

        def joined(ps: list[tuple[int, Content]]) -> Content:
            return sep.join(p for _, p in ps)

        while len(parts) > 1 and joined(parts).cell_length > room:
            worst = max(prio for prio, _ in parts)
            if worst == 0:
                break
            index = max(i for i, (prio, _) in enumerate(parts) if prio == worst)
            del parts[index]
        set_content(text_widget, joined(parts))

    def on_resize(self) -> None:
        if self._parts:
            self._fit()
