"""The two graphtop themes as textual ``Theme`` objects.

Colour choices: graph hits read as $success, eager fallbacks as $warning, failures and the
EMULATED badge as $error, so an engineer can tell "fast path" from "slow path" at a glance in both
themes. This is the only place in graphtop where literal colours appear.
"""

from __future__ import annotations

from textual.theme import Theme

from . import DARK, LIGHT

GRAPHTOP_DARK = Theme(
    name=DARK,
    primary="#4EA8FF",
    secondary="#9B8CFF",
    accent="#FFB454",
    warning="#F2C94C",
    error="#FF6B6B",
    success="#5FD38D",
    foreground="#D8DEE9",
    background="#0F141A",
    surface="#161D26",
    panel="#1D2733",
    dark=True,
)

GRAPHTOP_LIGHT = Theme(
    name=LIGHT,
    primary="#0B63C5",
    secondary="#6A4FD8",
    accent="#B86200",
    warning="#A66A00",
    error="#C62828",
    success="#1E7F45",
    foreground="#1B2430",
    background="#F6F8FA",
    surface="#FFFFFF",
    panel="#E7ECF2",
    dark=False,
)

THEMES: tuple[Theme, ...] = (GRAPHTOP_DARK, GRAPHTOP_LIGHT)
