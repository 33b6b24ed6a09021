"""Starting a web dashboard, for ``graphtop web`` and ``graphtop serve --dashboard`` alike: its socket bound
first (a port in use is one line, before anything loads), then where it is said once on stderr."""

from __future__ import annotations

import sys
from typing import Any, Optional

from .usage import UsageError


def _listen(host: str, port: int) -> Any:
    from graphtop.server.server import ServeError, listen

    try:
        return listen(host, port)
    except ServeError as e:
        raise UsageError(str(e)) from None


def make_dashboard(
    endpoint: str,
    token: str,
    *,
    host: str,
    port: int,
    key: Optional[str],
    label: str,
    max_tabs: int,
    max_queued: Optional[int],
    theme: Optional[str] = None,
    priority: Optional[str] = None,
) -> Any:
    """A WebDashboard of ``endpoint``, its socket bound (UsageError when it cannot be), not started; its
    tabs' processes run at ``priority`` (``cli.priority``; None: its default)."""
    from .priority import default_priority
    from .web_access import WebAccess
    from .web_server import WebDashboard, WebOptions
    from .web_tabs import TabCommand

    priority = priority or default_priority()
    command = TabCommand(endpoint, token, max_queued=max_queued, theme=theme, priority=priority)
    options = WebOptions(host=host, port=port, max_tabs=max_tabs, label=label)
    sock = _listen(host, port)
    return WebDashboard(command, WebAccess.for_address(host, key), options, sock)


def announce(dashboard: Any, out: Any = None) -> None:
    """Say where the dashboard is; a token made here is shown in its URL, here only."""
    out = out or sys.stderr
    line = f"graphtop: dashboard for browsers at {dashboard.url}"
    if dashboard.access.printed:
        line += "  (the token is shown only here)"
    elif dashboard.access.token is not None:
        line += "  (open it with ?token=API_KEY)"
    print(line, file=out, flush=True)
