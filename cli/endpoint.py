"""The engine side of an endpoint as the CLI opens it: for ``graphtop --model`` (the dashboard child
attaches to it) and headless runs with ``--telemetry``.

Its own module so that both launchers and ``graphtop attach`` share it without importing each other.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from graphtop.engine.telemetry.runtime import EndpointError

from .usage import UsageError

TOKEN_ENV = "GRAPHTOP_TELEMETRY_TOKEN"
"""How ``graphtop --model`` hands its endpoint's token to the dashboard child (never on argv)."""


def open_endpoint(bus: Any, address: str, label: str, *, say_where: bool = True) -> Any:
    """A TelemetryServer for ``bus``, announced on stderr; UsageError when it cannot be set up."""
    from graphtop.engine.telemetry.server import EndpointConfig, TelemetryServer

    try:
        server = TelemetryServer(bus, EndpointConfig(address=address, label=label))
    except EndpointError as exc:
        raise UsageError(str(exc)) from None
    if say_where:
        announce(server)
    return server


def announce(server: Any, out: Any = None) -> None:
    """Say once where the endpoint is (and its token when it is TCP: shown here and nowhere else)."""
    out = out or sys.stderr
    line = f"graphtop: telemetry on {server.endpoint} — graphtop attach {os.getpid()}"
    if server.endpoint.startswith("tcp://"):
        line += f"\ngraphtop: token {server.token} (kept 0600 in {server.folder}; remote viewers pass --token)"
    print(line, file=out, flush=True)
