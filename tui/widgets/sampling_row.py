"""Sampling settings as a compact row of inputs, validated before a prompt is sent.

Inline instead of a modal because an engineer flips temperature/seed between prompts constantly
(greedy vs sampled runs hit different code paths).
"""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.validation import Integer, Number, Validator
from textual.widgets import Checkbox, Input, Label

from ..safe_text import printable
from ..sessions.base import SamplingSettings
from .clean_input import CleanInput

# What a field takes as it is typed, partial values included ("-", "1.", "1e-"). Our own patterns, not
# Textual's Input(type="integer"/"number") ones: those nest quantifiers ((?:\d*|\d+_)*) and backtrack
# exponentially on a rejected keystroke (24 digits then a letter froze the UI for seconds, a pasted
# 30-digit value for minutes). Here no quantifier is nested and every digit run can only be followed by
# something a digit is not (".", "e", the end), so a failed match is linear. ASCII digits only.
INTEGER_RESTRICT = r"[-+]?[0-9]*"
NUMBER_RESTRICT = r"[-+]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]*)?|\.)?"

RESTRICTS = {"integer": INTEGER_RESTRICT, "number": NUMBER_RESTRICT}

PARAM_LABELS = {"max_new_tokens": "max tokens", "top_p": "top-p", "top_k": "top-k"}
"""The engine's parameter names as the row labels them, for its refusals."""

MAX_LENGTH = 32
"""Longest value a field takes: a 64-bit seed is 20 digits; anything longer is a slip or a paste."""

FIELDS = (
    # id, label, default, input type, tooltip
    ("max-tokens", "max", "128", "integer", "max new tokens (≥ 1)"),
    ("temperature", "temp", "0", "number", "temperature (0 = greedy)"),
    ("top-p", "top-p", "1", "number", "nucleus sampling, in (0, 1]"),
    ("top-k", "top-k", "0", "integer", "top-k cut (0 = off)"),
    ("seed", "seed", "", "integer", "random seed (empty = none)"),
)


FIELD_NAMES = {
    "max-tokens": "max tokens",
    "temperature": "temperature",
    "top-p": "top-p",
    "top-k": "top-k",
    "seed": "seed",
}
"""Each field's name in a refusal: Python's own words ("invalid literal for int() with base 10: ''")
named no field."""


def _read(vals: dict[str, str], fid: str, convert: type, empty: Any, none_when_empty: bool = False) -> Any:
    """Field ``fid``'s value through ``convert``; ``empty`` for an empty field (None: it must be filled,
    unless ``none_when_empty``). ValueError names the field."""
    text, name = vals[fid], FIELD_NAMES[fid]
    if not text:
        if empty is not None or none_when_empty:
            return empty
        raise ValueError(f"{name} is empty: enter {'an integer' if convert is int else 'a number'}")
    try:
        return convert(text)
    except ValueError:
        raise ValueError(
            f"{name}: {printable(text)!r} is not {'an integer' if convert is int else 'a number'}"
        ) from None


def describe(settings: SamplingSettings) -> str:
    """The settings a request was sent with, as its view's title shows them (the row's five)."""
    seed = "—" if settings.seed is None else str(settings.seed)
    return (
        f"max {settings.max_new_tokens} · T {settings.temperature:g} · top-p {settings.top_p:g} · "
        f"top-k {settings.top_k} · seed {seed}"
    )


class SamplingRow(Horizontal):
    """max · temp · top-p · top-k · seed · chat."""

    def __init__(self, *, blink: bool = True, id: str | None = None) -> None:
        super().__init__(id=id)
        self._blink = blink

    def compose(self) -> ComposeResult:
        for fid, label, default, kind, tip in FIELDS:
            yield Label(label, classes="sampling-label")
            validators: list[Validator] = [Integer() if kind == "integer" else Number()]  # as type=kind had
            field = CleanInput(
                value=default,
                type="text",
                restrict=RESTRICTS[kind],
                max_length=MAX_LENGTH,
                validators=validators,
                id=fid,
                classes="sampling-input",
                tooltip=tip,
                compact=True,
            )
            field.cursor_blink = self._blink
            yield field
        yield Checkbox(
            "chat", value=True, id="chat", compact=True, tooltip="Apply the tokenizer's chat template (when it has one)"
        )

    def settings(self) -> SamplingSettings:
        """Current values, or ValueError with a message naming the field."""
        vals = {fid: self.query_one(f"#{fid}", Input).value.strip() for fid, *_ in FIELDS}
        settings = SamplingSettings(
            max_new_tokens=_read(vals, "max-tokens", int, None),
            temperature=_read(vals, "temperature", float, 0.0),
            top_p=_read(vals, "top-p", float, 1.0),
            top_k=_read(vals, "top-k", int, 0),
            seed=_read(vals, "seed", int, None, True),
        )
        try:  # the engine's rules (NaN, 1e309, a seed past 64 bits...): refused as typed
            settings.to_params()
        except ValueError as exc:
            message = str(exc)
            for name, label in PARAM_LABELS.items():
                message = message.replace(name, label)
            raise ValueError(message) from None
        return settings

    @property
    def chat(self) -> bool:
        box = self.query_one("#chat", Checkbox)
        return box.value and not box.disabled

    def set_chat_available(self, available: bool) -> None:
        box = self.query_one("#chat", Checkbox)
        box.disabled = not available
        box.tooltip = "Apply the tokenizer's chat template" if available else "this tokenizer has no chat template"
