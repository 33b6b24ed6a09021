"""Commands: the one way other threads change what the engine does.

``submit``, ``cancel``, ``recapture``, ``set_parity_every`` and ``wait_for_capture`` may be called from
any thread while the step loop runs on another; each becomes a command in one queue that the loop
drains between steps, so the scheduler, the KV pool and the graphs are only ever touched by the loop's
own thread.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Iterator, Optional, Union

from ..request import Request, RequestHandle


@dataclass(frozen=True)
class Submit:
    request: Request


@dataclass(frozen=True)
class Cancel:
    """``handle``: cancel only the request of this handle (a handle's own cancel), never a newer request
    that has taken its id since; None: whichever request has the id (``Engine.cancel``)."""

    request_id: str
    handle: Optional[RequestHandle] = None


@dataclass(frozen=True)
class Recapture:
    decode_bs: Optional[tuple[int, ...]]
    prefill_num_tokens: Optional[tuple[int, ...]]


@dataclass(frozen=True)
class SetParityEvery:
    every: int  # check one graph step in this many; 0: off


@dataclass(frozen=True)
class AwaitCapture:
    """Set ``done`` once every capture asked for before this command has finished."""

    done: threading.Event


Command = Union[Submit, Cancel, Recapture, SetParityEvery, AwaitCapture]


class CommandQueue:
    """Thread-safe inbox of commands; ``wake`` is set on every put, so an idle loop reacts at once."""

    def __init__(self) -> None:
        self._queue: "queue.SimpleQueue[Command]" = queue.SimpleQueue()
        self.wake = threading.Event()

    def put(self, command: Command) -> None:
        self._queue.put(command)
        self.wake.set()

    def empty(self) -> bool:
        return self._queue.empty()

    def drain(self) -> Iterator[Command]:
        """Every command queued so far, oldest first (and any that arrive while draining)."""
        while True:
            try:
                yield self._queue.get_nowait()
            except queue.Empty:
                return
