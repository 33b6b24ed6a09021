"""Endpoints from the command line's side: serve one (``--telemetry``, the dashboard), list them
(``graphtop ps``) and open the dashboard on one (``graphtop attach``).

Engines announce themselves in the private runtime folder (``graphtop.engine.telemetry.runtime``);
an entry there also holds the endpoint's token, so attaching to an engine of the same user needs no
token on the command line. A TCP endpoint of another machine needs ``--token`` (or
``GRAPHTOP_TELEMETRY_TOKEN``): the engine printed it once when it started.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from pathlib import Path
from typing import Optional

from graphtop.engine.telemetry.plain_text import one_line
from graphtop.engine.telemetry.runtime import EndpointError, check_tcp_port, find_entry, list_entries

from .endpoint import TOKEN_ENV
from .usage import UsageError


def resolve_endpoint(
    endpoint: Optional[str], token: Optional[str], runtime_dir: Optional[Path] = None
) -> tuple[str, str, str]:
    """(endpoint, token, label) to attach to; UsageError with a one-line reason otherwise."""
    if endpoint is None:
        entries = list_entries(runtime_dir)
        if not entries:
            raise UsageError(
                "no running graphtop engine to attach to (start one with --telemetry, or call engine.serve_telemetry())"
            )
        if len(entries) > 1:
            names = ", ".join(f"{e.pid} ({e.endpoint})" for e in entries)
            raise UsageError(f"{len(entries)} engines are running; name one: {names}")
        entry = entries[0]
    else:
        entry = find_entry(endpoint, runtime_dir)
    if entry is not None:
        return entry.endpoint, token or entry.token, _model_name(entry.model) or entry.endpoint
    assert endpoint is not None
    if not endpoint.strip():
        raise UsageError(
            "the endpoint is empty: name a pid or endpoint from graphtop ps, or none for the one running engine"
        )
    if "://" not in endpoint:
        endpoint = f"ipc://{_check_socket(endpoint, endpoint)}"
    elif endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://") :]
        if not path:
            raise UsageError("endpoint ipc:// names no socket: use ipc://PATH (graphtop ps lists them)")
        if not path.startswith("@"):  # @NAME: Linux's abstract namespace, no file to look at
            _check_socket(path, endpoint)
    if not endpoint.startswith(("ipc://", "tcp://")):
        raise UsageError(f"endpoint {endpoint}: use ipc://PATH, tcp://HOST:PORT or a pid from graphtop ps")
    if endpoint.startswith("tcp://"):
        check_tcp_port(endpoint, wildcard=False)
    if not token:
        raise UsageError(
            f"{endpoint} is not an engine of this user here; pass --token (the engine printed "
            f"it when it started) or set {TOKEN_ENV}"
        )
    return endpoint, token, endpoint


def _check_socket(path: str, shown: str) -> Path:
    """The resolved ``path`` of an ``ipc`` endpoint; UsageError unless it is a Unix socket. Without this
    check a directory (``""`` is the current one) or a regular file became an endpoint that ZeroMQ
    cannot connect to, and the user was asked for a ``--token`` that would not have helped."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise UsageError(f"no running graphtop engine at {shown} (graphtop ps lists them)") from None
        raise UsageError(f"{shown}: {exc.strerror or exc}") from None
    if not stat.S_ISSOCK(mode):
        kind = " (it is a directory)" if stat.S_ISDIR(mode) else " (it is a regular file)" if stat.S_ISREG(mode) else ""
        raise UsageError(f"{shown} is not an engine socket{kind}; graphtop ps lists the engines")
    return Path(path).resolve()


def run_attach(
    endpoint: Optional[str],
    token: Optional[str],
    theme: Optional[str] = None,
    *,
    owner_pid: Optional[int] = None,
    poll_device: bool = True,
    runtime_dir: Optional[Path] = None,
    browser_tab: bool = False,
    max_queued: Optional[int] = None,
    priority: str = "normal",
) -> int:
    """Open the dashboard on a running engine's endpoint; ``q`` detaches. Returns an exit code.

    ``priority``: "idle" runs this process (every thread) at the lowest CPU priority (``cli.priority``) once
    it is attached; a browser tab's process (no terminal) moves to a session of its own for it.

    ``browser_tab``: this process draws a tab of ``graphtop web`` (textual-serve's pipes, not a terminal):
    its prompts obey the API's limits (``max_queued``: the API's --max-queued-requests) and it neither
    reads nor writes files on this host for the browser."""
    from graphtop.tui.sessions.remote import AttachError, RemoteSession

    try:
        address, secret, label = resolve_endpoint(endpoint, token or os.environ.get(TOKEN_ENV), runtime_dir)
    except EndpointError as exc:
        raise UsageError(str(exc)) from None
    if browser_tab:
        from graphtop.server.protocol import MAX_TEMPERATURE
        from graphtop.tui.sessions.browser_tab import BrowserTabSession, PromptLimits

        limits = PromptLimits(max_queued=max_queued, max_temperature=MAX_TEMPERATURE)
        session: RemoteSession = BrowserTabSession(address, secret, label=label, owner_pid=owner_pid, limits=limits)
    else:
        session = RemoteSession(address, secret, label=label, owner_pid=owner_pid)
    try:
        session.connect()
    except AttachError as exc:
        raise UsageError(f"cannot attach: {exc}") from None
    from .launch import run_app
    from .priority import apply

    apply(priority, own_session=browser_tab)  # once attached: a failed attach leaves its caller as it was

    return run_app(
        session, theme, poll_device=poll_device, exit_when_engine_ends=owner_pid is not None, browser_tab=browser_tab
    )


def run_ps(runtime_dir: Optional[Path] = None) -> int:
    """Print the attachable engines of this user: pid, model, device, uptime, endpoint."""
    entries = list_entries(runtime_dir)
    if not entries:
        print("no attachable graphtop engines (start one with --telemetry, or engine.serve_telemetry())")
        return 0
    rows = [("PID", "MODEL", "DEVICE", "UPTIME", "ENDPOINT")]
    now = time.time()
    rows += [
        tuple(
            map(
                one_line,
                (str(e.pid), _model_name(e.model) or "?", e.device or "loading…", _uptime(now - e.started), e.endpoint),
            )
        )  # entry text: no controls
        for e in entries
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    return 0


def _model_name(model: str) -> str:
    return model.rstrip("/").rsplit("/", 1)[-1] if "/" in model else model


def _uptime(seconds: float) -> str:
    s = int(max(seconds, 0))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
