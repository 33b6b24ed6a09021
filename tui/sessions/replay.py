"""Feeds a recorded trace to the dashboard in recorded-time order, with pause, seek and speed.

The replay clock is virtual: ``position`` (seconds since the first event) advances with an
injectable monotonic clock times ``speed`` while playing. Seeking forward just moves the position;
seeking backwards asks the app to rebuild its state from scratch (``take_reset``), because panels
hold folded history that cannot be un-applied.
"""

from __future__ import annotations

import bisect
import time
from typing import Callable, Optional, Sequence

from graphtop.engine.telemetry.events import Event, TraceHeader

from .base import Limits, SamplingSettings, StreamHandle

SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 64.0)


class ReplaySession:
    """A read-only :class:`~graphtop.tui.sessions.base.Session` over a trace's events."""

    kind = "replay"
    hosts_engine = False
    detaches = False
    ended = None
    silent_for = None

    def __init__(
        self,
        events: Sequence[Event],
        *,
        header: Optional[TraceHeader] = None,
        label: str = "trace",
        path: Optional[str] = None,
        clock: Callable[[], float] = time.monotonic,
        paused: bool = False,
    ) -> None:
        evs = [e for e in events if e.type != "header"]
        self.events = sorted(evs, key=lambda e: e.ts)  # stable: equal stamps keep file order
        self.header = header
        self.label = label
        self.path = path  # the file it was read from, if any: an export must not overwrite it
        self._clock = clock
        self._t0 = self.events[0].ts if self.events else 0.0
        self._offsets = [e.ts - self._t0 for e in self.events]
        self.cursor = 0  # events [0, cursor) have been handed out
        self._position = 0.0
        self._last_clock = clock()
        self.paused = paused
        self.speed = 1.0
        self._reset = False

    @classmethod
    def from_path(cls, path: str, **kwargs: object) -> "ReplaySession":
        """Read a trace (raises graphtop.engine.trace_tools.trace.TraceError with a one-line message)."""
        from graphtop.engine.trace_tools.trace import read_trace

        trace = read_trace(path)
        return cls(
            trace.events,
            header=trace.header,
            label=str(path),
            path=str(path),  # type: ignore[arg-type]
            **kwargs,
        )

    # -- clock ---------------------------------------------------------------------------------
    @property
    def duration(self) -> float:
        return self._offsets[-1] if self._offsets else 0.0

    @property
    def position(self) -> float:
        return self._position

    @property
    def total(self) -> int:
        return len(self.events)

    @property
    def finished(self) -> bool:
        return self.cursor >= len(self.events)

    def _advance(self) -> None:
        now = self._clock()
        if not self.paused:
            self._position = min(self._position + (now - self._last_clock) * self.speed, self.duration)
        self._last_clock = now

    def toggle_pause(self) -> bool:
        self._advance()
        self.paused = not self.paused
        return self.paused

    def change_speed(self, direction: int) -> float:
        self._advance()
        i = min(range(len(SPEEDS)), key=lambda k: abs(SPEEDS[k] - self.speed))
        self.speed = SPEEDS[min(max(i + direction, 0), len(SPEEDS) - 1)]
        return self.speed

    def seek(self, seconds: float) -> None:
        """Move the position by ``seconds`` (negative = back), clamped to the trace."""
        self._advance()
        self.seek_to(self._position + seconds)

    def seek_to(self, position: float) -> None:
        position = min(max(position, 0.0), self.duration)
        target = bisect.bisect_right(self._offsets, position)
        if target < self.cursor:
            self.cursor = 0
            self._reset = True
        self._position = position

    def seek_events(self, n: int) -> None:
        """Step ``n`` events forward or back (and pause: stepping is for inspecting)."""
        self._advance()
        self.paused = True
        target = min(max(self.cursor + n, 0), len(self.events))
        self.seek_to(self._offsets[target - 1] if target > 0 else -1.0)
        if target == 0:
            self._position = 0.0
            self.cursor, self._reset = 0, True

    def take_reset(self) -> bool:
        """True once after a backwards seek: the app must start from an empty state."""
        reset, self._reset = self._reset, False
        return reset

    # -- Session protocol ----------------------------------------------------------------------
    @property
    def replay(self) -> "ReplaySession":
        """Its own replay controls."""
        return self

    def start(self) -> None:
        self._last_clock = self._clock()

    def drain(self, max_items: Optional[int] = None) -> list[Event]:
        self._advance()
        end = bisect.bisect_right(self._offsets, self._position)
        if max_items is not None:
            end = min(end, self.cursor + max_items)
        out = self.events[self.cursor : end]
        self.cursor = max(self.cursor, end)
        return out

    @property
    def dropped(self) -> int:
        return 0

    @property
    def can_submit(self) -> bool:
        return False

    @property
    def chat_available(self) -> bool:
        return False

    def submit(self, prompt: str, settings: SamplingSettings, chat: bool) -> StreamHandle:
        raise RuntimeError("a replayed trace cannot run prompts")

    def recapture(self, decode_bs: Optional[list[int]], prefill_num_tokens: Optional[list[int]]) -> None:
        raise RuntimeError("a replayed trace cannot recapture")

    def buckets(self) -> tuple[Optional[list[int]], Optional[list[int]]]:
        return None, None

    def limits(self) -> Limits:
        return Limits()

    @property
    def parity_every(self) -> int:
        return 0  # a recorded trace's checks are in its events

    def set_parity_every(self, every: int) -> None:
        raise RuntimeError("a replayed trace cannot run parity checks")

    def drain_logs(self) -> list[tuple[int, str]]:
        return []

    def shutdown(self) -> None:
        pass
