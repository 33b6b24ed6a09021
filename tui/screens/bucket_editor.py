"""Bucket editor (``b``): edit decode/prefill buckets, see the what-if, confirm to recapture.

Validation is inline and per field, the preview is recomputed on every keystroke from the steps
seen so far, and the Recapture button stays disabled until both lists parse: a recapture costs
seconds of GPU time, so nothing half-typed should be able to trigger one. ``ctrl+o`` (Advise) fills
both fields with the bucket advisor's lists for the steps seen so far, at the graph counts in use and
within the static buffers' size, so the what-if shows the advice before anything is recaptured.

On a short terminal (below ``SHORT_HEIGHT`` rows, 80x24 included) the editor packs itself: fields and
buttons one row high, no syntax line (the placeholder and the error line say it), so the what-if, the
reason the editor exists, is on screen without scrolling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Mapping, Optional, Sequence

from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.widgets import Button, Input, Label, Static

from graphtop.engine.graphs.bucket_demand import advise_phase
from graphtop.engine.graphs.bucket_list import STATIC_BUFFERS_MAXIMUM, BucketList, BucketSpecError, format_buckets
from graphtop.engine.telemetry.recapture import estimate_capture_seconds

from ..fmt import human_bytes, pct, secs
from ..safe_text import printable
from ..whatif import WhatIf, WhatIfInputs, what_if
from ..widgets.clean_input import CleanInput
from .dialog import Dialog


@dataclass(frozen=True)
class BucketChoice:
    """The editor's result: None for a phase means "leave it as it is"."""

    decode_bs: Optional[list[int]]
    prefill_num_tokens: Optional[list[int]]


def _mem(value: Optional[float]) -> str:
    return "unknown" if value is None else human_bytes(value)


def _secs(value: Optional[float]) -> str:
    return "unknown" if value is None else secs(value)


def preview_text(now: WhatIf, cand: WhatIf, recapture_s: Optional[float] = None, changed: bool = True) -> Content:
    """Side-by-side now vs candidate; the numbers the confirm decision rests on. ``recapture_s``: the
    estimated capture work of the phases that change (``telemetry.recapture.estimate_capture_seconds``,
    the estimate the capture panel later shows beside what the recapture took)."""
    rows = [
        ("graph hit rate", pct(now.hit_rate), pct(cand.hit_rate)),
        ("  decode", pct(now.decode.hit_rate), pct(cand.decode.hit_rate)),
        ("  prefill", pct(now.prefill.hit_rate), pct(cand.prefill.hit_rate)),
        ("padding waste", pct(now.padding_waste), pct(cand.padding_waste)),
        ("graphs", str(now.graph_count), str(cand.graph_count)),
        ("est. graph memory", _mem(now.est_memory_bytes), _mem(cand.est_memory_bytes)),
        ("est. recapture work", "—", _secs(recapture_s) if changed else "unchanged"),
    ]
    lines = [
        Content.from_markup("[b]$a[/b]$b[b]$c[/b]", a=f"{'what-if':<20}", b=f"{'now':>12}", c=f"{'candidate':>12}")
    ]
    for name, a, b in rows:
        style = "$accent" if a != b else "$text-muted"
        lines.append(Content.from_markup(f"$n$a[{style}]$b[/]", n=f"{name:<20}", a=f"{a:>12}", b=f"{b:>12}"))
    lines.append(
        Content.from_markup(
            "[$text-muted]from $n steps seen (decode $d · prefill $p); memory and capture work from the "
            "captured buckets' measurements; a recapture runs between steps, so its wall time is longer[/]",
            n=f"{now.steps:,}",
            d=f"{now.decode.steps:,}",
            p=f"{now.prefill.steps:,}",
        )
    )
    return Content("\n").join(lines)


class BucketEditorScreen(Dialog[Optional[BucketChoice]]):
    """Two bucket fields with inline errors, a what-if preview, Recapture / Cancel."""

    AUTO_FOCUS = "#decode-input"
    SHORT_HEIGHT = 40
    """Below this many terminal rows the editor packs itself (``-short``) so the what-if shows whole."""
    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="buckets.cancel", tooltip="Close without recapturing"),
        Binding(
            "ctrl+s",
            "confirm",
            "Recapture",
            id="buckets.confirm",
            tooltip="Recapture graphs with these buckets (in-flight requests keep streaming)",
        ),
        Binding(
            "ctrl+o",
            "advise",
            "Advise",
            id="buckets.advise",
            tooltip="Fill both lists with the bucket advisor's lists for the steps seen so far",
        ),
    ]

    def __init__(
        self,
        decode: Sequence[int],
        prefill: Sequence[int],
        *,
        history: WhatIfInputs = WhatIfInputs(),
        max_running: Optional[int] = None,
        kv_capacity: Optional[int] = None,
        max_buckets: Mapping[str, Optional[int]] = {},
        disabled: Collection[str] = (),
        blink: bool = True,
        note: str = "",
        proposed: Optional[Mapping[str, Sequence[int]]] = None,
    ) -> None:
        """``max_buckets``: per phase, the largest bucket the engine's static buffers hold; ``disabled``:
        the phases the engine runs without graphs (shown read-only, left out of the recapture);
        ``note``: a line under the title (e.g. that a recapture is under way); ``proposed``: per phase,
        a list the field starts with instead of the one in use (the live advice)."""
        super().__init__()
        self.proposed = dict(proposed or {})
        self.disabled_phases = frozenset(disabled)
        if "decode" in self.disabled_phases:
            self.AUTO_FOCUS = "#prefill-input"  # a disabled field takes no focus
        self.note = note
        self.max_buckets = dict(max_buckets)
        self.current_decode = sorted(decode)
        self.current_prefill = sorted(prefill)
        self.history = history
        self.max_running = max_running
        self.kv_capacity = kv_capacity
        self._blink = blink
        self.parsed: dict[str, Optional[list[int]]] = {"decode": self.current_decode, "prefill": self.current_prefill}
        self._now = self._what_if(self.current_decode, self.current_prefill)

    def _what_if(self, decode: Sequence[int], prefill: Sequence[int]) -> WhatIf:
        h = self.history
        return what_if(
            h.steps,
            decode,
            prefill,
            h.costs,
            max_padding_waste=h.max_padding_waste,
            current_decode=self.current_decode,
            current_prefill=self.current_prefill,
        )

    def compose(self) -> ComposeResult:
        dec_max = f" (≤ max running {self.max_running})" if self.max_running else ""
        pre_max = f" (≤ KV pool {self.kv_capacity:,} tokens)" if self.kv_capacity else ""
        # title, buttons and keys stay in view; the fields and the what-if scroll on a short terminal
        with Vertical(id="bucket-editor", classes="modal-box"):
            yield Label("graph buckets", classes="modal-title")
            if self.note:
                yield Label(self.note, id="editor-note", classes="field-msg -note")
            with VerticalScroll(id="editor-body", classes="modal-body"):
                yield Label(f"decode batch sizes{dec_max}", classes="field-label")
                yield CleanInput(
                    format_buckets(self.proposed.get("decode") or self.current_decode),
                    id="decode-input",
                    placeholder="1,2,4,8-64:8",
                    disabled="decode" in self.disabled_phases,
                )
                yield Label("", id="decode-msg", classes="field-msg")
                yield Label(f"prefill token counts{pre_max}", classes="field-label")
                yield CleanInput(
                    format_buckets(self.proposed.get("prefill") or self.current_prefill),
                    id="prefill-input",
                    placeholder="64,128-1024:128",
                    disabled="prefill" in self.disabled_phases,
                )
                yield Label("", id="prefill-msg", classes="field-msg")
                yield Label(
                    "syntax: 1,2,4 · 8-64:8 = 8,16,…,64 · a-b = every integer", id="syntax-hint", classes="modal-hint"
                )
                yield Static(id="whatif")
            yield Label("enter/ctrl+s recapture · ctrl+o advise · tab next field · escape cancel", classes="modal-hint")
            with Horizontal(classes="modal-buttons"):
                yield Button("Advise", id="advise", tooltip="ctrl+o")
                yield Button("Recapture", variant="primary", id="confirm", tooltip="ctrl+s")
                yield Button("Cancel", id="cancel", tooltip="escape")

    def on_mount(self) -> None:
        for field in self.query(Input):
            field.cursor_blink = self._blink
        self._fit(self.app.size.height)
        self._validate("decode")
        self._validate("prefill")
        self.call_after_refresh(self.query_one("#editor-body").scroll_home, animate=False)  # labels above the field

    def on_resize(self, event: events.Resize) -> None:
        self._fit(event.size.height)

    def _fit(self, height: int) -> None:
        short = height < self.SHORT_HEIGHT
        self.set_class(short, "-short")
        for widget in (*self.query(Input), *self.query(Button)):
            widget.compact = short

    def _validate(self, phase: str) -> None:
        text = self.query_one(f"#{phase}-input", Input).value
        msg = self.query_one(f"#{phase}-msg", Label)
        if phase in self.disabled_phases:  # nothing to edit: the other phase alone may be recaptured
            self.parsed[phase] = self.current_decode if phase == "decode" else self.current_prefill
            msg.update(
                Content.from_markup(
                    "[$text-muted]$p graphs are disabled (--cuda-graph-backend-$p disabled): left as they are[/]",
                    p=phase,
                )
            )
            self._refresh_preview()
            return
        maximum, label = self._limit(phase)
        try:
            buckets = BucketList.parse(text, maximum=maximum, maximum_label=label).as_list()
        except BucketSpecError as exc:
            self.parsed[phase] = None
            msg.update(Content.from_markup("[$error]✗ $e[/]", e=printable(str(exc))))
            msg.set_class(True, "-error")
        else:
            self.parsed[phase] = buckets
            msg.update(
                Content.from_markup("[$success]✓[/] $n buckets: $b", n=str(len(buckets)), b=format_buckets(buckets))
            )
            msg.set_class(False, "-error")
        self._refresh_preview()

    def _limit(self, phase: str) -> tuple[Optional[int], str]:
        """The largest bucket ``phase`` may have and its name: the smaller of max running (decode) or
        the KV pool (prefill) and the static buffers' size, which the engine's recapture also enforces
        (a list past it closed the editor, and the recapture then failed with the typed list lost)."""
        own = (self.max_running, "max running") if phase == "decode" else (self.kv_capacity, "the KV pool size")
        limits = [lim for lim in (own, (self.max_buckets.get(phase), STATIC_BUFFERS_MAXIMUM)) if lim[0] is not None]
        return min(limits, key=lambda lim: lim[0]) if limits else (None, "the maximum")  # type: ignore[arg-type,return-value]

    def _refresh_preview(self) -> None:
        dec, pre = self.parsed["decode"], self.parsed["prefill"]
        ok = dec is not None and pre is not None
        self.query_one("#confirm", Button).disabled = not ok
        box = self.query_one("#whatif", Static)
        if not ok:
            box.update(Content.from_markup("[$text-muted]fix the bucket lists to see the what-if[/]"))
            return
        changed = {
            ph: b
            for ph, b, cur in (("decode", dec, self.current_decode), ("prefill", pre, self.current_prefill))
            if b != cur
        }
        box.update(
            preview_text(
                self._now,
                self._what_if(dec, pre),  # type: ignore[arg-type]
                estimate_capture_seconds(self.history.costs, changed),
                bool(changed),
            )
        )

    @on(Input.Changed)
    def _changed(self, event: Input.Changed) -> None:
        phase = "decode" if event.input.id == "decode-input" else "prefill"
        self._validate(phase)

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_confirm()

    @on(Button.Pressed, "#confirm")
    def _confirm_pressed(self) -> None:
        self.action_confirm()

    @on(Button.Pressed, "#advise")
    def _advise_pressed(self) -> None:
        self.action_advise()

    @on(Button.Pressed, "#cancel")
    def _cancel_pressed(self) -> None:
        self.action_cancel()

    def action_confirm(self) -> None:
        dec, pre = self.parsed["decode"], self.parsed["prefill"]
        if dec is None or pre is None:
            self.app.bell()
            return
        choice = BucketChoice(
            decode_bs=None if dec == self.current_decode or "decode" in self.disabled_phases else dec,
            prefill_num_tokens=None if pre == self.current_prefill or "prefill" in self.disabled_phases else pre,
        )
        self.dismiss(choice)

    def action_advise(self) -> None:
        """Both fields get the advisor's lists: as many graphs as the lists in use, buckets no larger
        than the static buffers; a phase without steps (or without graphs) is left as it is."""
        h = self.history
        notes = []
        for phase, current in (("decode", self.current_decode), ("prefill", self.current_prefill)):
            if not current or phase in self.disabled_phases:
                continue
            advice, demand = advise_phase(
                h.steps,
                phase,
                costs=h.costs,
                max_padding_waste=h.max_padding_waste,
                current=current,
                max_graphs=len(current),
                max_bucket=self.max_buckets.get(phase),
            )
            ratio = f"eager ÷ graph {demand.ratio.value:.2f}, {demand.ratio.source}"
            if not demand.sizes:
                notes.append(f"{phase}: no steps yet, left as it is")
            elif not advice.buckets:  # a recapture cannot take an empty list: say so, change nothing
                notes.append(f"{phase}: no graph pays off ({ratio}), left as it is")
            else:
                self.query_one(f"#{phase}-input", Input).value = format_buckets(advice.buckets)
                gain = advice.held_out.gain if advice.held_out is not None else None
                held = "" if gain is None else f"; held-out step cost {-100 * gain:+.1f} %"
                left = ""
                if advice.uncovered:
                    left = f"; sizes up to {advice.uncovered[-1]:,} stay eager: {advice.uncovered_because}"
                notes.append(f"{phase}: advised ({ratio}{held}{left})")
        self.notify("; ".join(notes) or "no graphs to advise", title="bucket advisor")

    def action_cancel(self) -> None:
        self.dismiss(None)
