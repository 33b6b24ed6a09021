"""One line that says what is running: model, device, dtype, attention and graph backends.

The EMULATED badge is its own widget with an $error background, not just a word in the line:
numbers from an emulated graph backend say nothing about real CUDA graphs, and nobody should be
able to miss that.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.content import Content
from textual.widgets import Label, Static

from .fmt import pct
from .panel import set_content
from .state import DashboardState


class StatusLine(Horizontal):
    """Model · device · dtype · attention · graph backends, plus EMULATED / mode badges."""

    def __init__(self, label: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.session_label = label
        self._seen: tuple | None = None

    def compose(self) -> ComposeResult:
        yield Label("graphtop", id="brand")
        yield Static(id="status-text")
        yield Label("EMULATED", id="badge-emulated", classes="badge")
        yield Label("", id="badge-mode", classes="badge")

    def on_mount(self) -> None:
        self.query_one("#badge-emulated").display = False
        self.query_one("#badge-mode").display = False

    def update_view(self, state: DashboardState, *, mode: str, dropped: int, force: bool = False) -> None:
        """``mode`` is '' (live), 'PAUSED', 'REPLAY', 'REPLAY · PAUSED' or 'LOADING'.

        Keyed on what the line shows (the hit rate as displayed, not the step count), so a busy
        engine whose hit rate holds steady costs no repaint at all.
        """
        key = (id(state), state.revs["info"], pct(state.hit_rate()), state.emulated, mode, dropped,
               state.failed)
        if key == self._seen and not force:
            return
        self._seen = key
        info = state.info
        if info is None:
            what = "engine failed" if state.failed else f"loading {self.session_label}…"
            text = Content.from_markup("[$text-muted]$what[/]", what=what)
        else:
            device = " ".join(p for p in (info.device, info.device_name) if p)
            model = info.model.rstrip("/").rsplit("/", 1)[-1] if info.model else self.session_label
            demo = " [$text-muted](demo, random weights)[/]" if info.demo else ""
            parts = [
                Content.from_markup(f"[b]$m[/b]{demo}", m=model),
                *(Content(p) for p in (device, info.dtype) if p),
                Content.from_markup("attn [b]$a[/b]", a=info.attention_backend or "?"),
                Content.from_markup(
                    "graphs decode [b]$d[/b] · prefill [b]$p[/b]",
                    d=info.decode_graph_backend or "eager", p=info.prefill_graph_backend or "eager",
                ),
                Content.from_markup("hit [$success]$h[/]", h=pct(state.hit_rate())),
            ]
            if dropped:
                parts.append(Content.from_markup("[$warning]dropped $n[/]", n=str(dropped)))
            text = Content(" │ ").join(parts)
        set_content(self.query_one("#status-text", Static), text)
        self.query_one("#badge-emulated").display = state.emulated
        badge = self.query_one("#badge-mode", Label)
        badge.display = bool(mode)
        set_content(badge, Content(mode))
        badge.set_class("paused" in mode.lower(), "-paused")
