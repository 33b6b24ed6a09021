"""``graphtop web [TARGET]``: the dashboard of a running engine, served to browsers (textual-serve).

TARGET is what ``graphtop attach`` takes (a pid or endpoint from ``graphtop ps``, ``tcp://HOST:PORT``),
or none for the one running engine. Every browser tab is a viewer of that engine, as an attached
terminal is; ``graphtop serve --dashboard`` serves the same page beside the API (``start_beside``).
Who may open it is ``web_access``'s rule; how tabs are run, ``web_tabs`` and ``web_server``.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from typing import Optional

from .endpoint import TOKEN_ENV
from .flag_types import int_in, nonempty, nonneg_int
from .flags import _Parser
from .help_text import HelpFormatter, document
from .priority import PRIORITIES, PRIORITY_HELP, apply, default_priority
from .usage import UsageError

API_KEY_ENV = "GRAPHTOP_API_KEY"
MAX_TABS_FLAG = 1000
"""The most --max-tabs takes: each tab is a process of its own (tens of MB)."""
ENGINE_CHECK_S = 1.0


def build_web_parser() -> argparse.ArgumentParser:
    from .web_server import DEFAULT_MAX_TABS, DEFAULT_PORT

    p = _Parser(
        prog="graphtop web",
        description="Serve the dashboard of a running engine to browsers: every tab is a viewer, as\n"
        "graphtop attach is, and the engine never waits for one. Listens on 127.0.0.1 unless --host\n"
        "says otherwise; on any other address a token is required (--api-key, else one printed once).",
        epilog="examples:\n  graphtop serve --telemetry &      # an engine to watch\n"
        "  graphtop web                      # then open http://127.0.0.1:8001/\n"
        "  graphtop web 48213 --host 0.0.0.0 # for the team: prints the URL with its token",
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "target",
        nargs="?",
        metavar="TARGET",
        help="a pid or endpoint from graphtop ps, or tcp://HOST:PORT (default: the one running engine)",
    )
    p.add_argument("--token", help="the engine endpoint's token (needed for an engine of another machine)")
    p.add_argument("--host", default="127.0.0.1", metavar="HOST", help="address to listen on")
    p.add_argument("--port", type=int_in(0, 65535), default=DEFAULT_PORT, metavar="PORT", help="0: a free one")
    p.add_argument(
        "--api-key",
        type=nonempty("API key"),
        metavar="KEY",
        help=f"browsers must give this key (?token=KEY): the API's (default: ${API_KEY_ENV}; else, off "
        "loopback, a token printed once)",
    )
    p.add_argument(
        "--max-tabs",
        type=int_in(1, MAX_TABS_FLAG),
        default=DEFAULT_MAX_TABS,
        metavar="N",
        help="browser tabs served at once; past them a page says the dashboard is full",
    )
    p.add_argument(
        "--max-queued-requests",
        type=nonneg_int,
        metavar="N",
        help="as graphtop serve's: a tab's prompt is refused while the engine holds its running slots "
        "plus N requests (default: the API's 1024)",
    )
    p.add_argument("--theme", help="graphtop-dark (default), graphtop-light or any Textual theme")
    p.add_argument(
        "--priority",
        choices=PRIORITIES,
        default=default_priority(),
        help=PRIORITY_HELP + " (this server and every tab's process)",
    )
    return document(p)


def run_web(args: argparse.Namespace) -> int:
    """Serve until Ctrl-C or SIGTERM, or until a local engine's socket is gone."""
    from graphtop.engine.telemetry.runtime import EndpointError
    from graphtop.server.options import DEFAULT_MAX_QUEUED

    from .attach import resolve_endpoint
    from .web_start import announce, make_dashboard

    _check_theme(args.theme)
    try:
        endpoint, token, label = resolve_endpoint(args.target, args.token or os.environ.get(TOKEN_ENV))
    except EndpointError as exc:
        raise UsageError(str(exc)) from None
    max_queued = DEFAULT_MAX_QUEUED if args.max_queued_requests is None else args.max_queued_requests
    dashboard = make_dashboard(
        endpoint,
        token,
        host=args.host,
        port=args.port,
        key=args.api_key or os.environ.get(API_KEY_ENV) or None,
        label=label,
        max_tabs=args.max_tabs,
        max_queued=max_queued,
        theme=args.theme,
        priority=args.priority,
    ).start()
    announce(dashboard)
    apply(args.priority)  # every thread, the server's too, and the tabs it starts; not before: an error
    # above leaves its caller as it was (a priority, once lowered, cannot be raised again)
    print("graphtop: Ctrl-C stops", file=sys.stderr, flush=True)
    gone = None
    try:
        wait = threading.Event()
        while _engine_there(endpoint):
            wait.wait(ENGINE_CHECK_S)
        gone = f"the engine at {endpoint} is gone; "
    except KeyboardInterrupt:
        pass
    finally:
        dashboard.close()
    print(f"graphtop: {gone or ''}web dashboard stopped", file=sys.stderr, flush=True)
    return 0 if gone is None else 1


def _check_theme(name: Optional[str]) -> None:
    """A theme no tab could draw is one line here, not an error in every tab."""
    if not name:
        return
    from textual.theme import BUILTIN_THEMES

    from graphtop.themes.palette import THEMES

    known = {t.name for t in THEMES} | set(BUILTIN_THEMES)
    if name not in known:
        raise UsageError(f"unknown theme {name!r}; choose from {', '.join(sorted(known))}")


def _engine_there(endpoint: str) -> bool:
    """False once a local engine's socket is gone (a remote one can only go silent: its tabs say so)."""
    if not endpoint.startswith("ipc://") or endpoint.startswith("ipc://@"):
        return True
    return os.path.exists(endpoint[len("ipc://") :])
