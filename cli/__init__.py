"""graphtop.cli: the ``graphtop`` command line (``graphtop.cli.entry:main``).

Every command lives here: the dashboard's launchers, headless runs, ``trace``, ``advise``, ``attach``,
``ps`` and ``serve``. It builds on the dashboard (``graphtop.tui``) and the HTTP server
(``graphtop.server``); neither imports it.
"""
