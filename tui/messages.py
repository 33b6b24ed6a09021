"""Typed messages posted from thread workers to the app (``post_message`` is thread-safe).

Only rare, coarse things travel as messages (engine ready/failed, a device sample per second);
the event firehose is pulled by the UI timer instead, so the engine thread never waits on the UI.
"""

from __future__ import annotations

from textual.message import Message

from .device_probe import DeviceSample


class EngineReady(Message):
    """The session loaded the model; the engine serves (it captures graphs between steps)."""


class EngineFailed(Message):
    """The session could not start; the dashboard stays open to show why."""

    def __init__(self, error: str, details: str = "") -> None:
        super().__init__()
        self.error = error
        self.details = details


class DeviceSampled(Message):
    """A fresh GPU/host reading from the device poller."""

    def __init__(self, sample: DeviceSample) -> None:
        super().__init__()
        self.sample = sample
