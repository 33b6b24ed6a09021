"""The snapshot a new viewer gets keeps the engine's own errors: the endpoint's refusals of clients are
kept apart (a few), so junk sent at the refusal log's rate cannot push real errors out."""

from __future__ import annotations

from graphtop.engine.telemetry.events import ErrorEvent
from graphtop.engine.telemetry.state_keeper import RECENT_REFUSALS, REFUSAL_WHERE, StateKeeper


def test_refusals_do_not_evict_the_engines_errors_from_the_snapshot() -> None:
    keeper = StateKeeper(recent_alerts=50)
    real = [ErrorEvent(message=f"engine error {i}", where="decode", ts=float(i)) for i in range(3)]
    keeper.fold_all(real)
    keeper.fold_all(
        ErrorEvent(message=f"refused a client: junk {i}", where=REFUSAL_WHERE, ts=10.0 + i) for i in range(500)
    )
    snap = [e for e in keeper.snapshot() if e.type == "error"]
    assert [e.message for e in snap if e.where != REFUSAL_WHERE] == [e.message for e in real]
    refusals = [e.message for e in snap if e.where == REFUSAL_WHERE]
    assert refusals == [f"refused a client: junk {i}" for i in range(500 - RECENT_REFUSALS, 500)]
    assert keeper.retained == len(snap)
