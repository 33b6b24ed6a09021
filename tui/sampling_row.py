"""Sampling settings as a compact row of inputs, validated before a prompt is sent.

Inline instead of a modal because an engineer flips temperature/seed between prompts constantly
(greedy vs sampled runs hit different code paths).
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Checkbox, Input, Label

from .session import SamplingSettings

FIELDS = (
    # id, label, default, input type, tooltip
    ("max-tokens", "max", "128", "integer", "max new tokens (≥ 1)"),
    ("temperature", "temp", "0", "number", "temperature (0 = greedy)"),
    ("top-p", "top-p", "1", "number", "nucleus sampling, in (0, 1]"),
    ("top-k", "top-k", "0", "integer", "top-k cut (0 = off)"),
    ("seed", "seed", "", "integer", "random seed (empty = none)"),
)


class SamplingRow(Horizontal):
    """max · temp · top-p · top-k · seed · chat."""

    def __init__(self, *, blink: bool = True, id: str | None = None) -> None:
        super().__init__(id=id)
        self._blink = blink

    def compose(self) -> ComposeResult:
        for fid, label, default, kind, tip in FIELDS:
            yield Label(label, classes="sampling-label")
            field = Input(value=default, type=kind, id=fid, classes="sampling-input", tooltip=tip,  # type: ignore[arg-type]
                          compact=True)
            field.cursor_blink = self._blink
            yield field
        yield Checkbox("chat", value=True, id="chat", compact=True,
                       tooltip="Apply the tokenizer's chat template (when it has one)")

    def settings(self) -> SamplingSettings:
        """Current values, or ValueError with a message naming the field."""
        vals = {fid: self.query_one(f"#{fid}", Input).value.strip() for fid, *_ in FIELDS}
        try:
            max_new = int(vals["max-tokens"])
            temp = float(vals["temperature"] or 0)
            top_p = float(vals["top-p"] or 1)
            top_k = int(vals["top-k"] or 0)
            seed = int(vals["seed"]) if vals["seed"] else None
        except ValueError as exc:
            raise ValueError(f"sampling settings: {exc}") from None
        if max_new < 1:
            raise ValueError("max tokens must be ≥ 1")
        if temp < 0:
            raise ValueError("temperature must be ≥ 0")
        if not 0 < top_p <= 1:
            raise ValueError("top-p must be in (0, 1]")
        if top_k < 0:
            raise ValueError("top-k must be ≥ 0")
        return SamplingSettings(max_new, temp, top_p, top_k, seed)

    @property
    def chat(self) -> bool:
        box = self.query_one("#chat", Checkbox)
        return box.value and not box.disabled

    def set_chat_available(self, available: bool) -> None:
        box = self.query_one("#chat", Checkbox)
        box.disabled = not available
        box.tooltip = (
            "Apply the tokenizer's chat template" if available else "this tokenizer has no chat template"
        )
