"""What a viewer that attaches mid-run needs first: the engine's state, rebuilt from its own events.

The keeper folds the event stream (on the endpoint's publisher thread, never the engine's) and
retains only what still describes the engine: the EngineStarted, config downgrades, the latest
capture of each phase with its per-bucket progress, the latest memory ledger and KV state, the
recapture in flight or last finished, recent errors, a ring of recent steps, and the requests not
finished yet. ``snapshot()`` returns these in stream order, so folding them into an empty dashboard
state gives what a viewer watching since the start would show for those areas. The engine itself
needs no snapshot code.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from typing import Callable, Iterable

from .events import Event

Item = tuple[int, Event]  # (seq, event)

REFUSAL_WHERE = "telemetry endpoint"
"""``ErrorEvent.where`` of the endpoint's own refusals of clients."""
RECENT_REFUSALS = 5
"""Refusals kept for the snapshot, apart from the engine's errors: a client sending junk at the
refusal log's rate would otherwise push every real engine error out of what a new viewer sees."""


class StateKeeper:
    def __init__(self, *, recent_steps: int = 4096, recent_alerts: int = 50, open_requests: int = 10_000) -> None:
        self.next_seq = 0
        self._started: list[Item] = []
        self._downgrades: deque[Item] = deque(maxlen=recent_alerts)
        self._errors: deque[Item] = deque(maxlen=recent_alerts)
        self._refusals: deque[Item] = deque(maxlen=RECENT_REFUSALS)
        self._capture: dict[str, list[Item]] = {}
        self._latest: dict[str, Item] = {}  # memory_ledger, kv_pool, recapture_* : the last one counts
        self._steps: deque[Item] = deque(maxlen=recent_steps)
        self._open: OrderedDict[str, list[Item]] = OrderedDict()
        self._open_cap = open_requests
        self._fold: dict[str, Callable[[Item], None]] = {
            "engine_started": self._on_started,
            "config_downgrade": self._downgrades.append,
            "error": self._on_error,
            "capture_started": self._on_capture_started,
            "capture_progress": self._on_capture,
            "capture_finished": self._on_capture,
            "memory_ledger": self._keep_latest,
            "kv_pool": self._keep_latest,
            "recapture_requested": self._keep_latest,
            "recapture_finished": self._keep_latest,
            "step": self._steps.append,
            "request_queued": self._on_request_queued,
            "request_first_token": self._on_request,
            "request_finished": self._on_request_finished,
        }

    def fold_all(self, events: Iterable[Event]) -> None:
        fold = self._fold
        seq = self.next_seq
        for ev in events:
            handler = fold.get(ev.type)
            if handler is not None:
                handler((seq, ev))
            seq += 1
        self.next_seq = seq

    def snapshot(self) -> list[Event]:
        """The retained events in the order the engine published them."""
        parts: list[Iterable[Item]] = [
            self._started,
            self._downgrades,
            self._errors,
            self._refusals,
            self._steps,
            sorted(self._latest.values(), key=_seq),
        ]
        parts += self._capture.values()
        parts += self._open.values()
        return [ev for _, ev in heapq.merge(*parts, key=_seq)]

    # -- folding ----------------------------------------------------------------------------------
    def _on_error(self, item: Item) -> None:
        refusal = getattr(item[1], "where", None) == REFUSAL_WHERE
        (self._refusals if refusal else self._errors).append(item)

    def _on_started(self, item: Item) -> None:
        self._started = [item]

    def _on_capture_started(self, item: Item) -> None:
        self._capture[item[1].phase] = [item]  # type: ignore[attr-defined]

    def _on_capture(self, item: Item) -> None:
        self._capture.setdefault(item[1].phase, []).append(item)  # type: ignore[attr-defined]

    def _keep_latest(self, item: Item) -> None:
        ev = item[1]
        if ev.type == "recapture_finished":
            self._latest.pop("recapture_requested", None)
        self._latest[ev.type] = item

    def _on_request_queued(self, item: Item) -> None:
        self._open[item[1].request_id] = [item]  # type: ignore[attr-defined]
        if len(self._open) > self._open_cap:
            self._open.popitem(last=False)

    def _on_request(self, item: Item) -> None:
        items = self._open.get(item[1].request_id)  # type: ignore[attr-defined]
        if items is not None:
            items.append(item)

    def _on_request_finished(self, item: Item) -> None:
        self._open.pop(item[1].request_id, None)  # type: ignore[attr-defined]

    @property
    def has_started(self) -> bool:
        return bool(self._started)

    @property
    def open_requests(self) -> int:
        return len(self._open)

    @property
    def retained(self) -> int:
        """How many events a snapshot holds now (bounded by the constructor's limits)."""
        return (
            len(self._started)
            + len(self._downgrades)
            + len(self._errors)
            + len(self._refusals)
            + len(self._steps)
            + len(self._latest)
            + sum(map(len, self._capture.values()))
            + sum(map(len, self._open.values()))
        )


def _seq(item: Item) -> int:
    return item[0]
