"""The requests an engine knows by id, from submit to finish: the one home of that bookkeeping.

A request's id is claimed on the submitting thread (``RequestIds``); once the step loop applies its
submit it is admitted to the scheduler and found by id (a cancel goes by id); when it finishes, output
processing releases all three together. Command application and output processing share this part, so
neither calls back into the engine that owns them.
"""

from __future__ import annotations

from typing import Optional

from ..request import Request, RequestIds
from ..scheduler import Scheduler


class RequestsInFlight:
    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.ids = RequestIds()  # claimed at submit, on any thread
        self._by_id: dict[str, Request] = {}  # admitted: the step loop's thread only

    def admit(self, req: Request) -> None:
        """A submitted request joins the scheduler's queue (its id was claimed at submit)."""
        self._by_id[req.request_id] = req
        self.scheduler.add(req)

    def find(self, request_id: str) -> Optional[Request]:
        return self._by_id.get(request_id)

    def release(self, req: Request) -> None:
        """A finished request gives back its scheduler slot, its KV pages and its id."""
        self.scheduler.finish(req)
        self._by_id.pop(req.request_id, None)
        self.ids.release(req.request_id)

    def longest_context(self) -> int:
        """Tokens the longest admitted request may hold after its next step (0: none admitted)."""
        return max((len(r.prompt_ids) + len(r.output_ids) + 1 for r in self._by_id.values()), default=0)
