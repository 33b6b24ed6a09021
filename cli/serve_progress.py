"""What ``graphtop serve`` says on stdout while its model loads: one line per phase, flushed at once.

A server is started by supervisors and scripts more than by hand, so this is plain lines, not the
headless run's progress bars: a log collector or ``grep`` reads them as they come. Loading a large model
or converting a GGUF takes minutes, and meanwhile ``/health`` answers 503: these lines say what it waits
for. One more subscriber of the engine's event bus (its own thread prints), stopped once the engine
serves; a stdout nobody reads any more silences it and never stops the server.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Optional

from graphtop.engine.telemetry import events as ev

EVENT_TYPES = ("load_progress", "engine_started", "capture_started", "capture_finished")


def say(line: str) -> bool:
    """``line`` on stdout, flushed; False when stdout cannot be written (it is then left alone)."""
    try:
        print(line, flush=True)
    except OSError:  # a closed pipe or a full disk: the server goes on without its progress lines
        return False
    return True


class LoadLines:
    """Prints a line per load phase from the bus until ``stop()``."""

    def __init__(self, bus: Any) -> None:
        self._bus = bus
        self._sub = bus.subscribe("serve-progress", maxsize=10_000, types=EVENT_TYPES)
        self._started = time.perf_counter()
        self._phase: Optional[tuple[str, str]] = None
        self._quiet = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="graphtop-serve-progress", daemon=True)

    def start(self) -> "LoadLines":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Print what was published so far, then stop."""
        self._stop.set()
        self._thread.join()
        self._bus.unsubscribe(self._sub)
        for event in self._sub.drain():
            self.handle(event)

    def _run(self) -> None:
        while not self._stop.is_set():
            event = self._sub.get(timeout=0.1)
            if event is not None:
                self.handle(event)

    def _say(self, line: str) -> None:
        if not self._quiet and not say(f"graphtop: {line}"):
            self._quiet = True

    def handle(self, event: ev.Event) -> None:
        """A line for an event that starts a phase; none for progress within one (a tensor of many)."""
        if isinstance(event, ev.LoadProgress):
            phase = (event.label, event.step)
            if phase != self._phase:
                self._phase = phase
                self._say(f"{event.label} — {event.step}" if event.step else event.label)
        elif isinstance(event, ev.EngineStarted):
            name = Path(event.model).name or event.model
            seconds = time.perf_counter() - self._started
            self._say(f"loaded {name} on {event.device_name or event.device} ({event.dtype}) in {seconds:.1f} s")
        elif isinstance(event, ev.CaptureStarted) and event.buckets:
            self._say(f"capturing {event.phase} graphs: {len(event.buckets)} buckets")
        elif isinstance(event, ev.CaptureFinished):
            failed = f", {len(event.failed)} failed" if event.failed else ""
            self._say(f"captured {len(event.captured)} {event.phase} graphs in {event.seconds:.1f} s{failed}")


def start_load_lines(bus: Any, model: Optional[str], health_url: str) -> LoadLines:
    """The first line (what loads, and that /health says 503 meanwhile), then one per phase."""
    what = model if model is not None else "the demo model"
    say(f"graphtop: loading {what}; {health_url} answers 503 until it serves")
    return LoadLines(bus).start()
