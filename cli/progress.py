"""Progress for headless runs on a terminal: model loading (a .gguf's one-time conversion tensor by tensor),
graph capture per phase, requests done of total and output tokens per second, drawn with rich on stderr.

It is one more subscriber of the engine's event bus (its own thread drains it), so the engine knows
nothing about it. It exists only when stderr is a terminal: a piped or redirected run gets exactly
the output it had without it, and the engine does not even build the step events it would read.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from graphtop.engine.telemetry import events as ev

# What the display reads; KV and ledger events are frequent and say nothing it shows.
EVENT_TYPES = (
    "engine_started",
    "load_progress",
    "capture_started",
    "capture_progress",
    "capture_finished",
    "request_queued",
    "request_first_token",
    "request_finished",
    "step",
)
NOTE_INTERVAL_S = 0.2  # tokens/s is recomputed at most this often


class HeadlessProgress:
    """The display; ``start`` before the engine loads, ``stop`` once the run is over."""

    def __init__(self, bus: Any, total_requests: int, console: Console):
        self.total_requests = total_requests
        self._sub = bus.subscribe("headless-progress", maxsize=100_000, types=EVENT_TYPES)
        self._bus = bus
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[note]}"),
            console=console,
            redirect_stdout=False,
            transient=False,
        )
        self._loading = self.progress.add_task("loading model", total=None, note="")
        self._capture: dict[str, TaskID] = {}
        self._requests: Optional[TaskID] = None
        self._tokens = 0  # first tokens + decode rows: live, may count a row a finished request drops
        self._finished = 0
        self._finished_tokens = 0  # exact, from each request's finish
        self._first_queued: Optional[float] = None
        self._note_at = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="graphtop-progress", daemon=True)

    def start(self) -> "HeadlessProgress":
        self.progress.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Show every event published so far, then leave the final lines on the terminal."""
        self._stop.set()
        self._thread.join()
        self._bus.unsubscribe(self._sub)
        for event in self._sub.drain():
            self.handle(event)
        self._update_rate(force=True)
        self.progress.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            event = self._sub.get(timeout=0.1)
            if event is not None:
                self.handle(event)
            self._update_rate()

    # --- events --------------------------------------------------------------------------------
    def handle(self, event: ev.Event) -> None:
        p = self.progress
        if isinstance(event, ev.EngineStarted):
            p.update(
                self._loading,
                description=f"loaded {Path(event.model).name or event.model}",
                total=1,
                completed=1,
                note=f"{event.device_name} · {event.dtype}",
            )
        elif isinstance(event, ev.LoadProgress):  # a long load says what it does (a .gguf's conversion)
            step = f" — {event.step}" if event.step else ""  # its count is the bar's own i/N column
            p.update(self._loading, description=f"{event.label}{step}", total=event.total or None, completed=event.done)
        elif isinstance(event, ev.CaptureStarted) and event.buckets:
            self._capture[event.phase] = p.add_task(
                f"capture {event.phase}", total=len(event.buckets), note=f"{event.backend}"
            )
        elif isinstance(event, ev.CaptureProgress) and event.phase in self._capture:
            note = f"bucket {event.bucket} {event.seconds:.2f} s" + ("" if event.ok else " failed")
            p.update(self._capture[event.phase], completed=event.index, note=note)
        elif isinstance(event, ev.CaptureFinished) and event.phase in self._capture:
            failed = f", {len(event.failed)} failed" if event.failed else ""
            p.update(
                self._capture[event.phase],
                completed=len(event.captured) + len(event.failed),
                note=f"{event.seconds:.1f} s{failed}",
            )
        elif isinstance(event, ev.RequestQueued):
            if self._requests is None:
                self._first_queued = time.perf_counter()
                self._requests = p.add_task("requests", total=self.total_requests or None, note="")
        elif isinstance(event, ev.RequestFirstToken):
            self._tokens += 1
        elif isinstance(event, ev.StepEvent):
            if event.phase == "decode":
                self._tokens += event.batch_size
        elif isinstance(event, ev.RequestFinished):
            self._finished += 1
            self._finished_tokens += event.output_tokens
            if self._requests is not None:
                p.advance(self._requests)

    def _update_rate(self, force: bool = False) -> None:
        now = time.perf_counter()
        if (
            self._requests is None
            or self._first_queued is None
            or (not force and now - self._note_at < NOTE_INTERVAL_S)
        ):
            return
        self._note_at = now
        done = self.total_requests and self._finished >= self.total_requests
        tokens = self._finished_tokens if done else max(self._tokens, self._finished_tokens)
        elapsed = now - self._first_queued
        rate = tokens / elapsed if elapsed > 0 else 0.0
        self.progress.update(self._requests, note=f"{tokens} tokens · {rate:.1f} tok/s")


def start_headless_progress(
    bus: Any, total_requests: int, stream: Optional[TextIO] = None, console: Optional[Console] = None
) -> Optional[HeadlessProgress]:
    """A running display when ``stream`` (default stderr) is a terminal, else None (and no subscription)."""
    if console is None:
        stream = sys.stderr if stream is None else stream
        if not stream.isatty():
            return None
        console = Console(file=stream)
    return HeadlessProgress(bus, total_requests, console).start()
