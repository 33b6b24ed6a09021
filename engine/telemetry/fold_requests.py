"""The fold's facts about requests: their lifecycle from queued to finished, and the latencies it gives.

A request is open from its ``request_queued`` to its ``request_finished``; while open the fold keeps
its events (a viewer attaching mid-run is sent them) and its TTFT, which its finish turns into the
inter-token latency (``latency.mean_itl_ms``, the one rule). A finished request is handed to each
listener as a ``Finished`` record (the metrics' histograms observe it), and counted.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Optional

from .events import Event, RequestFinished, RequestFirstToken, RequestQueued
from .history import Samples
from .latency import mean_itl_ms
from .measured import measured

__all__ = ["Finished", "OpenRequest", "RequestFacts"]

REJECTED = "rejected"
"""The finish reason of a request refused before it was served (no latency of serving to count)."""


@dataclass
class OpenRequest:
    """A request between its queueing and its finish: its TTFT once known, and its events so far."""

    ttft_ms: Optional[float] = None
    events: list[tuple[int, Event]] = field(default_factory=list)  # (seq, event); empty: queued unseen


@dataclass(frozen=True)
class Finished:
    """One finished request, as the fold derived it."""

    request_id: str
    finish_reason: str
    output_tokens: int
    latency_ms: float
    ttft_ms: Optional[float]  # None: its first token was not seen (or it had none)
    itl_ms: Optional[float]  # ``mean_itl_ms``; None for fewer than two tokens or an unknown TTFT

    @property
    def served(self) -> bool:
        """False for a request refused before it ran (its latency is no time of serving)."""
        return self.finish_reason != REJECTED


class RequestFacts:
    """Counts, open requests (at most ``open_cap``, the oldest forgotten first) and latency samples."""

    def __init__(self, samples: Optional[int], open_cap: int) -> None:
        self.queued = 0
        self.finished = 0
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.errors = 0  # finished with an error
        self.reasons: Counter[str] = Counter()  # finish_reason as given ("" when none) -> requests
        self.first_queued_ts: Optional[float] = None
        self.last_finished_ts: Optional[float] = None
        self.open: OrderedDict[str, OpenRequest] = OrderedDict()
        self.open_cap = open_cap
        self.ttft_ms = Samples(samples)
        self.queue_ms = Samples(samples)  # of a TTFT, the time before the request's first admission
        self.latency_ms = Samples(samples)  # every finished request, rejected ones included
        self.itl_ms = Samples(samples)  # served requests of two or more tokens
        self.on_finish: list[Callable[[Finished], None]] = []

    def on_queued(self, seq: int, ev: RequestQueued) -> None:
        self.queued += 1
        self.prompt_tokens += ev.prompt_tokens
        if self.first_queued_ts is None or ev.ts < self.first_queued_ts:
            self.first_queued_ts = ev.ts
        self.open.pop(ev.request_id, None)  # an id queued again is the newest request, not the old one's place
        self.open[ev.request_id] = OpenRequest(events=[(seq, ev)])
        if len(self.open) > self.open_cap:
            self.open.popitem(last=False)

    def on_first_token(self, seq: int, ev: RequestFirstToken) -> None:
        ttft = measured(ev.ttft_ms)
        if ttft is not None:
            self.ttft_ms.add(ttft)
        queue = measured(ev.queue_ms)
        if queue is not None:
            self.queue_ms.add(queue)
        req = self.open.get(ev.request_id)
        if req is None:  # queued before the stream began (or forgotten): its TTFT still gives an ITL
            req = self.open[ev.request_id] = OpenRequest()
            if len(self.open) > self.open_cap:
                self.open.popitem(last=False)
        elif req.events:
            req.events.append((seq, ev))
        req.ttft_ms = ev.ttft_ms

    def on_finished(self, ev: RequestFinished) -> None:
        self.finished += 1
        self.output_tokens += ev.output_tokens
        self.reasons[ev.finish_reason] += 1
        if ev.error is not None:
            self.errors += 1
        if self.last_finished_ts is None or ev.ts > self.last_finished_ts:
            self.last_finished_ts = ev.ts
        req = self.open.pop(ev.request_id, None)
        ttft = req.ttft_ms if req is not None else None
        latency = measured(ev.latency_ms)
        if latency is not None:
            self.latency_ms.add(latency)
        done = Finished(ev.request_id, ev.finish_reason, ev.output_tokens, ev.latency_ms, ttft, None)
        if done.served:
            itl = mean_itl_ms(measured(ttft), ev.latency_ms, ev.output_tokens) if latency is not None else None
            if itl is not None:
                done = Finished(ev.request_id, ev.finish_reason, ev.output_tokens, ev.latency_ms, ttft, itl)
                self.itl_ms.add(itl)
        for listener in self.on_finish:
            listener(done)

    def reasons_or(self, unspecified: str) -> Counter[str]:
        """Finished requests by reason; one that gave none counts as ``unspecified``."""
        out: Counter[str] = Counter()
        for reason, n in self.reasons.items():
            out[reason or unspecified] += n
        return out
