"""Prompts typed before the engine exists: held by the session, sent in order once it is ready.

The dashboard is up in a second; the model takes longer to load. A prompt typed meanwhile must not be
refused or lost: the session answers at once with a :class:`QueuedHandle` (the console shows it as
queued) and, when the engine is ready, submits every held prompt in the order typed and binds each
handle to the engine's own. Any session (in-process or attached to a remote engine) can hold its
prompts in a :class:`PromptQueue`.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional

SubmitFn = Callable[..., Any]
"""The session's own submit, ``(prompt, settings, chat) -> StreamHandle``. Kept opaque here: the
session module holds a PromptQueue, so this module does not import it back."""


class QueuedHandle:
    """A :class:`~graphtop.tui.sessions.base.StreamHandle` for a held prompt: no text and not finished until
    it is bound to the engine's handle (then everything is the engine's), or failed."""

    def __init__(self, placeholder_id: str) -> None:
        self._placeholder_id = placeholder_id
        self._handle: Any = None  # the engine's StreamHandle once sent
        self._error: Optional[str] = None

    @property
    def queued(self) -> bool:
        """Still waiting for the engine (the console says so)."""
        return self._handle is None and self._error is None

    @property
    def request_id(self) -> Any:
        return self._handle.request_id if self._handle is not None else self._placeholder_id

    @property
    def finished(self) -> bool:
        return self._handle.finished if self._handle is not None else self._error is not None

    @property
    def finish_reason(self) -> Optional[str]:
        if self._handle is not None:
            return self._handle.finish_reason
        return "rejected" if self._error is not None else None

    @property
    def error(self) -> Optional[str]:
        return self._handle.error if self._handle is not None else self._error

    def new_text(self) -> str:
        return self._handle.new_text() if self._handle is not None else ""

    def bind(self, handle: Any) -> None:
        self._handle = handle

    def fail(self, error: str) -> None:
        self._error = error


@dataclass
class _Held:
    args: tuple[Any, ...]  # what the session's submit takes
    handle: QueuedHandle


class PromptQueue:
    """Thread-safe: ``submit`` runs on the UI thread, ``release``/``fail`` on the thread that loads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: list[_Held] = []
        self._ids = itertools.count(1)
        self._submit: Optional[SubmitFn] = None
        self._error: Optional[str] = None

    def submit(self, *args: Any) -> Any:
        """Hold the prompt (``args``: what the session's submit takes) while nothing can take it, and
        return a QueuedHandle; once ``release`` ran, submit at once and return the engine's handle."""
        with self._lock:
            if self._error is not None:
                raise RuntimeError(self._error)
            if self._submit is None:
                handle = QueuedHandle(f"queued-{next(self._ids)}")
                self._held.append(_Held(args, handle))
                return handle
            submit = self._submit
        return submit(*args)

    def release(self, submit: SubmitFn) -> int:
        """Submit every held prompt, in the order typed, and send later ones straight to ``submit``.
        Returns how many were held. A prompt the engine refuses fails alone, with the engine's reason."""
        with self._lock:  # held: a prompt typed meanwhile must not overtake the queue
            held, self._held = self._held, []
            for item in held:
                try:
                    item.handle.bind(submit(*item.args))
                except Exception as exc:  # one bad prompt must not lose the others
                    item.handle.fail(str(exc) or type(exc).__name__)
            self._submit = submit
        return len(held)

    def fail(self, error: str) -> None:
        """The engine will never come: every held prompt fails with ``error``, and so do later ones."""
        with self._lock:
            held, self._held = self._held, []
            self._error = error
        for item in held:
            item.handle.fail(error)

    @property
    def held(self) -> int:
        with self._lock:
            return len(self._held)
