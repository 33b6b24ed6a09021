"""What attached viewers ask of the engine, and the prompt text that streams back to each of them.

The endpoint's publisher thread calls ``CommandDesk.handle`` for every command from an attached
viewer and ``stream_tokens`` once per batch. Commands reach the engine through an :class:`EngineLink`
(``graphtop.engine.lifecycle.telemetry_link``) whose calls only queue work for the engine thread, so nothing here
waits on the engine; a command the engine refuses is answered with its message, never raised.

A viewer names its requests as it likes, but the engine knows them as ``v<serial>/<name>``: each
viewer's names live in their own namespace, so no viewer can claim (and then cancel) an id of the
engine's own or another viewer's requests, nor take one of the engine's ``req-N`` ids before it is
handed out. Answers go back under the viewer's own name.

The slow parts of a command (tokenizing a prompt: ``Engine.submit`` does it in the caller's thread;
writing an export) run on one worker thread, never on the publisher thread, so a viewer's burst of
megabyte prompts or exports does not pause every viewer's stream. The publisher thread keeps all the
bookkeeping and sends every answer (a ZeroMQ socket belongs to one thread): it polls the worker's
results in ``stream_tokens``.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from . import protocol as p
from .events import Event
from .plain_text import one_line
from .trace_writer import write_trace

MAX_REQUEST_ID = 64
MAX_VIEWER_REQUESTS = 256
"""Requests one viewer may have in flight (the engine decodes at most ``max_running_requests`` at once,
256 by default): past it a Submit is rejected, so one viewer cannot queue without bound ahead of
everyone else's work."""


class StreamSource(Protocol):
    """What the endpoint reads a submitted prompt's progress from (the engine's RequestHandle)."""

    finished: bool
    finish_reason: Any
    error: Optional[str]

    def new_text(self) -> str: ...


def _reason(exc: BaseException) -> str:
    """A refused command's answer: the exception's own message (its type when it has none)."""
    return str(exc) or type(exc).__name__


MAX_VIEWER_EXPORTS = 2
"""Exports one viewer may have waiting for the worker: each writes every retained event to disk."""


class PendingStream:
    """A Submit while the worker tokenizes it; then the engine's handle (or why it was refused).

    Read only on the publisher thread. A cancel that comes before the engine has the request is
    remembered and sent once it has it (sent earlier, the engine would not know the id yet)."""

    def __init__(self, future: "Future[StreamSource]") -> None:
        self.future = future
        self.cancel_wanted = False

    def _handle(self) -> Optional[StreamSource]:
        if not self.future.done() or self.future.exception() is not None:
            return None
        return self.future.result()

    @property
    def finished(self) -> bool:
        handle = self._handle()
        return self.future.done() and (handle is None or handle.finished)

    @property
    def finish_reason(self) -> Any:
        handle = self._handle()
        return "rejected" if handle is None else handle.finish_reason

    @property
    def error(self) -> Optional[str]:
        handle = self._handle()
        if handle is not None:
            return handle.error
        exc = self.future.exception() if self.future.done() else None
        return _reason(exc) if exc is not None else None

    def new_text(self) -> str:
        handle = self._handle()
        return handle.new_text() if handle is not None else ""


class EngineLink(Protocol):
    """The engine as the endpoint's commands see it; every call returns at once."""

    def status(self) -> p.EngineStatus: ...
    def state_events(self) -> list[Event]:
        """The engine's state as events (engine started, capture, ledger, KV): what the endpoint's
        keeper missed when it started after the engine."""
        ...

    def submit(self, request_id: str, prompt: str, sampling: p.Sampling, chat: bool) -> StreamSource: ...
    def cancel(self, request_id: str) -> None: ...
    def recapture(self, decode_bs: Optional[list[int]], prefill_num_tokens: Optional[list[int]]) -> None: ...
    def set_parity_every(self, every: int) -> None: ...


@dataclass(eq=False)
class Viewer:
    """One attached viewer (a ZeroMQ routing identity that said Hello with the right token)."""

    identity: bytes
    name: str
    attached: float
    last_sent: float = 0.0
    sent_events: int = 0
    dropped_events: int = 0
    requests: set[str] = field(default_factory=set)  # the viewer's own names of its requests in flight
    exports: int = 0  # its exports waiting for the worker
    prefix: str = ""  # "v<serial>/": its requests' namespace in the engine (CommandDesk assigns it)


class CommandDesk:
    def __init__(self, send: Callable[[Viewer, Any], None], retained: Callable[[], list[Event]]) -> None:
        self.link: Optional[EngineLink] = None
        self.failed: Optional[str] = None
        self.streams: dict[str, tuple[Viewer, str, StreamSource]] = {}  # engine id -> viewer, its name, stream
        self._serial = 0
        self._send = send
        self._retained = retained
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="graphtop-endpoint-work")
        self._answers: list[tuple[Viewer, int, "Future[str]"]] = []  # exports on the worker
        self._orphans: list[tuple[str, PendingStream]] = []  # submits of viewers that left, to cancel

    def close(self) -> None:
        """Stop the worker; what it has not started is dropped (the endpoint is closing)."""
        self._worker.shutdown(wait=False, cancel_futures=True)

    def handle(self, viewer: Viewer, msg: Any) -> Optional[str]:
        """Act on one command; returns why it is refused when this viewer may not give it."""
        if isinstance(msg, p.Submit):
            self._submit(viewer, msg)
        elif isinstance(msg, p.Cancel):
            if msg.request_id not in viewer.requests:
                return f"cancel of {msg.request_id[:MAX_REQUEST_ID]!r}, which this viewer did not submit"
            engine_rid = viewer.prefix + msg.request_id
            entry = self.streams.get(engine_rid)
            self._cancel(engine_rid, entry[2] if entry is not None else None)
        elif isinstance(msg, p.Recapture):
            self._answer(
                viewer,
                msg.cid,
                lambda link: (
                    link.recapture(msg.decode_bs, msg.prefill_num_tokens)
                    or "recapture queued for the next step boundary"
                ),
            )
        elif isinstance(msg, p.SetParity):
            self._answer(
                viewer,
                msg.cid,
                lambda link: (
                    link.set_parity_every(msg.every)
                    or (f"parity checks: one graph step in {msg.every}" if msg.every else "parity checks off")
                ),
            )
        elif isinstance(msg, p.ExportTrace):
            if viewer.exports >= MAX_VIEWER_EXPORTS:
                self._send(
                    viewer,
                    p.Result(
                        msg.cid,
                        False,
                        f"{viewer.exports} exports of this viewer are still being written: wait for them",
                    ),
                )
            else:
                viewer.exports += 1
                events = self._retained()  # taken here: the state keeper belongs to the publisher thread
                self._answers.append((viewer, msg.cid, self._worker.submit(self._export, msg.path, events)))
        return None

    def _cancel(self, engine_rid: str, handle: Optional[StreamSource]) -> Optional[PendingStream]:
        """Cancel ``engine_rid`` now, or once the worker has handed it to the engine (sent earlier, the
        engine would not know the id yet): then the PendingStream it waits for (``_send_late_cancel``)."""
        if isinstance(handle, PendingStream) and not handle.future.done():
            handle.cancel_wanted = True
            return handle
        if self.link is not None:
            self.link.cancel(engine_rid)
        return None

    def _send_late_cancel(self, engine_rid: str, pending: PendingStream) -> None:
        """The cancel ``_cancel`` put off, once the worker is done (a refused submit needs none)."""
        if pending.cancel_wanted and pending.future.done():
            pending.cancel_wanted = False
            if pending.future.exception() is None and self.link is not None:
                self.link.cancel(engine_rid)

    def forget(self, viewer: Viewer) -> None:
        """A viewer left: the prompts it submitted are cancelled (nobody else reads them)."""
        for rid in viewer.requests:
            engine_rid = viewer.prefix + rid
            entry = self.streams.pop(engine_rid, None)
            waiting = self._cancel(engine_rid, entry[2]) if entry is not None else None
            if waiting is not None:
                self._orphans.append((engine_rid, waiting))
        viewer.requests.clear()

    def stream_tokens(self) -> None:
        """Send what the worker and the engine have for the viewers: export answers, streamed text."""
        self._finish_worker_answers()
        for engine_rid, (viewer, rid, handle) in list(self.streams.items()):
            if isinstance(handle, PendingStream):
                self._send_late_cancel(engine_rid, handle)
            finished = handle.finished  # read first: once finished, new_text() holds all the rest
            text = handle.new_text()
            if not text and not finished:
                continue
            reason = handle.finish_reason
            error = handle.error if finished else None
            self._send(
                viewer,
                p.Tokens(
                    rid,
                    text,
                    finished,
                    getattr(reason, "value", reason) if finished else None,
                    one_line(error) if error else error,
                ),
            )
            if finished:
                self.streams.pop(engine_rid, None)
                viewer.requests.discard(rid)

    def _finish_worker_answers(self) -> None:
        for entry in [a for a in self._answers if a[2].done()]:
            self._answers.remove(entry)
            viewer, cid, future = entry
            viewer.exports -= 1
            exc = future.exception()
            if exc is not None:
                self._send(viewer, p.Result(cid, False, one_line(_reason(exc))))
            else:
                self._send(viewer, p.Result(cid, True, one_line(future.result())))
        for entry in [o for o in self._orphans if o[1].future.done()]:
            self._orphans.remove(entry)
            self._send_late_cancel(*entry)

    def _answer(self, viewer: Viewer, cid: int, action: Callable[[Any], str]) -> None:
        if self.link is None:
            self._send(viewer, p.Result(cid, False, self.failed or "the engine is still loading"))
            return
        try:
            message = action(self.link)
        except Exception as exc:  # a refused command is an answer, not a crash
            self._send(viewer, p.Result(cid, False, one_line(_reason(exc))))
            return
        self._send(viewer, p.Result(cid, True, one_line(message)))

    def _export(self, path: str, events: list[Event]) -> str:
        if path.endswith(("/", os.sep)):  # Path() drops the slash: "new/" would be written as a file "new"
            raise ValueError(f"{path}: names a folder; give a file path (it is written on the engine's host)")
        target = Path(path).expanduser()
        if not target.is_absolute():
            raise ValueError(f"{path}: give an absolute path (it is written on the engine's host)")
        if target.exists():
            raise FileExistsError(f"{target} exists; the engine does not overwrite files")
        n = write_trace(target, events, meta={"source": "graphtop endpoint", "pid": os.getpid()})
        return f"{n:,} events → {target}"

    def _submit(self, viewer: Viewer, msg: p.Submit) -> None:
        rid = msg.request_id

        def finish(error: str) -> None:
            self._send(viewer, p.Tokens(rid, "", True, "rejected", one_line(error)))

        if not rid or len(rid) > MAX_REQUEST_ID or rid in viewer.requests:
            finish("request id is empty, too long or already in use")
            return
        if len(viewer.requests) >= MAX_VIEWER_REQUESTS:
            finish(
                f"this viewer has {len(viewer.requests)} requests in flight, the most the endpoint takes "
                "from one viewer: wait for some to finish"
            )
            return
        if self.link is None:
            finish(self.failed or "the engine is still loading")
            return
        if not viewer.prefix:
            self._serial += 1
            viewer.prefix = f"v{self._serial}/"
        link, engine_rid = self.link, viewer.prefix + rid
        # tokenizing happens in Engine.submit: on the worker (its errors, e.g. bad sampling values, come
        # back through the PendingStream as a rejection with the engine's own message)
        pending = PendingStream(self._worker.submit(link.submit, engine_rid, msg.prompt, msg.sampling, msg.chat))
        self.streams[engine_rid] = (viewer, rid, pending)
        viewer.requests.add(rid)
