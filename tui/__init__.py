"""graphtop's Textual dashboard.

Kept free of textual imports on purpose: the headless CLI imports ``graphtop.tui.cli.entry`` and must not
pay textual's import time. Textual is imported only by ``app.py`` and the widget modules, which
``launch.py`` imports lazily.
"""
