"""graphtop's themes and stylesheets.

Theme *objects* live in :mod:`graphtop.themes.palette` (imports textual); this module only names
them and locates the .tcss files, so importing it stays free. The stylesheets use theme variables
only ($primary, $surface, $error, …): that is what makes the palette's theme switcher — including
textual's built-in themes — restyle every panel.
"""

from __future__ import annotations

from pathlib import Path

THEMES_DIR = Path(__file__).resolve().parent
DARK = "graphtop-dark"
LIGHT = "graphtop-light"
DEFAULT_THEME = DARK
THEME_NAMES = (DARK, LIGHT)
STYLESHEETS = (THEMES_DIR / "graphtop.tcss", THEMES_DIR / "modals.tcss")

__all__ = ["DARK", "LIGHT", "DEFAULT_THEME", "THEME_NAMES", "STYLESHEETS", "THEMES_DIR"]
