"""The session of a browser tab of ``graphtop web``: an attached viewer whose prompts obey the API's limits.

Whoever reaches the web dashboard types prompts into the same engine that ``graphtop serve`` answers
over HTTP, so a prompt from a tab is held to what the API would take from a client: a temperature of
at most OpenAI's 2, and no new request once the engine holds as many as the API admits (its running
slots plus ``--max-queued-requests``), where the API answers 429. The browser reaches the engine only
through this process's keys, so refusing here is refusing the browser. The endpoint's own per-viewer
limits (256 requests in flight, 1 MiB a prompt) hold as for any viewer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from .base import SamplingSettings
from .remote import RemoteSession

if TYPE_CHECKING:
    from graphtop.engine.telemetry.events import Event


@dataclass(frozen=True)
class PromptLimits:
    """``max_queued``: requests that may wait beyond the running batch (the API's
    ``--max-queued-requests``; None: no bound). ``max_temperature``: the API's bound."""

    max_queued: Optional[int]
    max_temperature: float


class BrowserTabSession(RemoteSession):
    """A ``RemoteSession`` that refuses, with the API's words, a prompt the API would refuse."""

    def __init__(self, *args: Any, limits: PromptLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.prompt_limits = limits
        self._in_flight: Optional[tuple[int, int]] = None  # (running + queued, max_running), the latest seen

    def drain(self, max_items: Optional[int] = None) -> list["Event"]:
        events = super().drain(max_items)
        for ev in events:
            if ev.type == "kv_pool":
                self._in_flight = (ev.running + ev.queued, ev.max_running)
        return events

    def submit(self, prompt: str, settings: SamplingSettings, chat: bool) -> Any:
        problem = self.refusal(settings)
        if problem:
            raise ValueError(problem)
        return super().submit(prompt, settings, chat)

    def refusal(self, settings: SamplingSettings) -> Optional[str]:
        """Why the API would refuse a prompt with ``settings`` now, or None."""
        most = self.prompt_limits.max_temperature
        if settings.temperature > most:
            return f"temperature {settings.temperature:g} is over {most:g}, the most the API takes"
        queued = self.prompt_limits.max_queued
        if queued is not None and self._in_flight is not None:
            in_flight, max_running = self._in_flight
            limit = max_running + queued
            if in_flight >= limit:
                return (
                    f"the engine holds {in_flight} requests, the API's limit ({max_running} running + "
                    f"{queued} queued): retry later"
                )
        return None
