"""How a bad value appears in a one-line error message: short, whatever it was.

Its own dependency-free module because every boundary check quotes values (graph config, sampling
parameters, trace lines, CLI flags) and those live in packages that must not import each other.
"""

from __future__ import annotations

from typing import Any


LIMIT = 40
"""Longest quoted value or token in a message, in characters."""


def short_text(text: str) -> str:
    """Text as a message quotes it: whole when short, cut when someone pasted a megabyte."""
    return text if len(text) <= LIMIT else text[: LIMIT - 3] + "..."


def short_repr(v: Any) -> str:
    """A bad value as a one-line message shows it (a 5000-digit int is described, not printed)."""
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 128:
        return f"an integer of {v.bit_length()} bits"
    return short_text(repr(v))
