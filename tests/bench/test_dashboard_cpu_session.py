"""bench/dashboard_cpu.py's synthetic session has every member of the dashboard's Session protocol: a
member it lacks stops the app on its first use, and the benchmark then waits forever for a ready engine."""

from __future__ import annotations

import dashboard_cpu

from graphtop.tui.sessions.base import Session


def test_the_synthetic_session_has_every_session_member():
    session = dashboard_cpu.SyntheticSession()
    members = {n for n in dir(Session) if not n.startswith("_")} | set(Session.__annotations__)
    assert members  # the protocol is read, not an empty set
    assert sorted(n for n in members if not hasattr(session, n)) == []
