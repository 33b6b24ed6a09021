"""How a bad value is quoted in a one-line message: the one rule for the models and the engine.

At the bottom of the house (no torch, no other graphtop module), so that everything may quote values
the same way: the models' config checks, and the engine's boundaries through ``engine/arguments.py``,
whose telemetry and graph policies load no torch. ``graphtop.models`` loads its torch-backed parts only
when they are asked for (models/__init__.py), so importing this module loads no torch either.
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
