"""A viewer whose connection is shut after it attached says Hello again on the next one and goes on.

The endpoint knows a viewer by its connection; ZeroMQ reconnects a shut one on its own, and without a
new Hello the endpoint would count the viewer gone while the viewer believed itself attached, showing a
frozen picture (what the crowd test once caught, when the gate shut a connection that had passed)."""

from __future__ import annotations

import os
from pathlib import Path

from support.waiting import wait_for

from graphtop.engine.telemetry.bus import EventBus
from graphtop.engine.telemetry.events import StepEvent
from graphtop.engine.telemetry.gate import _connection, _local_address, _shut
from graphtop.engine.telemetry.server import EndpointConfig, TelemetryServer
from graphtop.tui.sessions.remote import RemoteSession


def shut_accepted_connections(endpoint: str) -> int:
    """Shut every connection this process accepted on ``endpoint`` (as the gate shuts one)."""
    local = _local_address(endpoint)
    shut = 0
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        seen = _connection(fd, local)
        if seen is not None and _shut((fd, seen[0]), local):
            shut += 1
    return shut


TIMEOUT_S = 20.0


def steps_seen(session: RemoteSession) -> list[int]:
    return [e.step for e in session.drain() if isinstance(e, StepEvent)]


def test_a_viewer_shut_after_it_attached_comes_back_and_sees_what_follows(tmp_path: Path) -> None:
    server = TelemetryServer(EventBus(), EndpointConfig(runtime_dir=tmp_path, address="tcp://127.0.0.1:*"))
    session = RemoteSession(server.endpoint, server.token, connect_timeout=20.0)
    try:
        session.connect()
        wait_for(lambda: len(server.viewers) == 1, TIMEOUT_S, "the endpoint to count the viewer")
        first = next(iter(server.viewers))
        server.bus.publish(StepEvent(step=1))
        wait_for(lambda: 1 in steps_seen(session), TIMEOUT_S, "step 1")
        assert shut_accepted_connections(server.endpoint) == 1
        # the endpoint meets the new connection's Hello, and forgets the old one at its next send
        wait_for(lambda: list(server.viewers) not in ([], [first]), TIMEOUT_S, "the viewer to say Hello again")
        server.bus.publish(StepEvent(step=2))
        seen: list[int] = []
        wait_for(lambda: seen.extend(steps_seen(session)) or 2 in seen, TIMEOUT_S, "step 2 on the new connection")
        assert seen == [2]  # the rejoin's snapshot (step 1 again) is not shown twice
        assert any("reconnected to the engine" in message for _, message in session.drain_logs())
        wait_for(lambda: len(server.viewers) == 1, TIMEOUT_S, "the old connection to be forgotten")
    finally:
        session.shutdown()
        server.close()
