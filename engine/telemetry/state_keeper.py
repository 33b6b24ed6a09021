"""What a viewer that attaches mid-run needs first: the engine's state, rebuilt from its own events.

The keeper is a view over a ``RunFold`` (folded on the endpoint's publisher thread, never the
engine's): the fold retains the events that still describe the engine (the EngineStarted, config
downgrades, each rank's latest capture pass of each phase with its per-bucket progress, each rank's
latest memory ledger, the KV state, the recapture in flight or last finished, recent errors, a ring of
recent steps, and the requests not finished yet), and ``snapshot()`` returns them in stream order, so
folding them into an empty dashboard state gives what a viewer watching since the start would show
for those areas. The engine itself needs no snapshot code.
"""

from __future__ import annotations

from typing import Iterable

from .events import Event
from .fold import RECENT_REFUSALS, REFUSAL_WHERE, FoldLimits, RunFold

__all__ = ["RECENT_REFUSALS", "REFUSAL_WHERE", "StateKeeper"]


class StateKeeper:
    """A fold that remembers ``recent_steps`` steps, ``recent_alerts`` downgrades and errors (and a
    few refusals apart), ``open_requests`` unfinished requests, and no timing samples. It does not
    tally steps either: the endpoint's thread folds every step while the engine waits for the GIL it
    holds, and a viewer rebuilds the tallies from the steps it is sent."""

    def __init__(self, *, recent_steps: int = 4096, recent_alerts: int = 50, open_requests: int = 10_000) -> None:
        limits = FoldLimits(
            steps=recent_steps,
            samples=0,
            alerts=recent_alerts,
            captures=1,
            open_requests=open_requests,
            step_tallies=False,
        )
        self.fold = RunFold(limits)

    @property
    def next_seq(self) -> int:
        """The sequence number the next event folded gets (the endpoint numbers its batches by it)."""
        return self.fold.seq

    def fold_all(self, events: Iterable[Event]) -> None:
        self.fold.apply_all(events)

    def snapshot(self) -> list[Event]:
        """The retained events in the order the engine published them."""
        return self.fold.retained()

    @property
    def has_started(self) -> bool:
        return self.fold.info is not None

    @property
    def open_requests(self) -> int:
        return len(self.fold.requests.open)

    @property
    def retained(self) -> int:
        """How many events a snapshot holds now (bounded by the constructor's limits)."""
        return len(self.fold.retained())
