"""graphtop's Textual dashboard.

Kept free of textual imports on purpose: the command line (``graphtop.cli``) imports the dashboard's
plain modules (state, what-if, formatting, sessions) in headless runs and must not pay textual's import
time. Textual is imported only by ``app.py`` and the widget modules, which ``graphtop.cli.launch``
imports lazily.
"""
