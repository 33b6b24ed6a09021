"""A dashboard session attached to an engine's telemetry endpoint (another process, maybe another host).

The engine side is ``graphtop.engine.telemetry.server``. Here one I/O thread owns the ZeroMQ DEALER
socket (ZeroMQ sockets are not thread-safe): it says Hello, receives the Welcome, the snapshot and the
live stream, decodes events into a bounded queue the UI timer drains, feeds streamed text into
:class:`RemoteHandle`s, and sends the commands the UI queued. Rendering never waits on the socket and
the engine never waits on the viewer.

Lost events are counted, never hidden (``event_stream.EventStream``): they add up in ``dropped``, which
the status line shows.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Optional

import msgspec
import zmq

from graphtop.engine.telemetry import protocol as p
from graphtop.engine.telemetry import wire
from graphtop.engine.telemetry.pid_check import process_alive

from .base import Limits, SamplingSettings, SessionError
from .event_stream import EventStream
from .prompt_queue import PromptQueue

if TYPE_CHECKING:
    from graphtop.engine.telemetry.events import Event

STALE_AFTER_S = 5.0
"""No message (the engine sends a heartbeat every second) for this long: say the engine is silent."""


class AttachError(Exception):
    """The endpoint did not let this viewer attach; the message is one line."""


class RemoteHandle:
    """A prompt submitted through the endpoint; its text arrives in ``Tokens`` messages."""

    def __init__(self, request_id: str, session: "RemoteSession") -> None:
        self.request_id = request_id
        self._session = session
        self._lock = threading.Lock()
        self._text = ""
        self._read = 0
        self.finished = False
        self.finish_reason: Optional[str] = None
        self.error: Optional[str] = None
        self.sent_bytes = 0  # the Submit's size on the wire: a size refusal names it (Refused.message_bytes)
        self.answered = False  # the engine sent Tokens for it: a refusal is not about this one
        self._done = threading.Event()

    def _feed(self, msg: p.Tokens) -> None:
        self.answered = True
        with self._lock:
            self._text += msg.text
            if msg.finished:
                self.finish_reason, self.error = msg.finish_reason, msg.error
                self.finished = True
        if msg.finished:
            self._done.set()

    @property
    def text(self) -> str:
        with self._lock:
            return self._text

    def new_text(self) -> str:
        with self._lock:
            delta = self._text[self._read :]
            self._read = len(self._text)
            return delta

    def wait(self, timeout: Optional[float] = None) -> bool:
        return self._done.wait(timeout)

    def cancel(self) -> None:
        self._session.cancel(self.request_id)


class RemoteSession:
    """The :class:`~graphtop.tui.sessions.base.Session` of a viewer attached to an endpoint."""

    kind = "live"
    replay = None
    hosts_engine = False

    def __init__(
        self,
        endpoint: str,
        token: str,
        *,
        label: Optional[str] = None,
        queue_size: int = 50_000,
        connect_timeout: float = 10.0,
        owner_pid: Optional[int] = None,
    ) -> None:
        self.endpoint = endpoint
        self.label = label or endpoint
        self._token = token
        self.name = f"v{os.getpid()}"
        self.queue_size = queue_size
        self.connect_timeout = connect_timeout
        self.owner_pid = owner_pid
        self.detaches = owner_pid is None  # the dashboard of `graphtop --model` ends its engine on q
        self.welcome: Optional[p.Welcome] = None
        self.status = p.EngineStatus()
        self._parity_every: Optional[int] = None
        self.prompts = PromptQueue()  # prompts typed before the engine is ready
        self._logs: deque[tuple[int, str]] = deque(maxlen=200)
        self._handles: dict[str, RemoteHandle] = {}
        self._results: dict[int, p.Result] = {}
        self._result_ready = threading.Condition()
        self._outbox: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self._ids = itertools.count(1)
        self._welcomed = threading.Event()
        self._refused: Optional[str] = None
        self._ended: Optional[str] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.stream = EventStream(queue_size, lambda message: self._logs.append((logging.WARNING, message)))
        self.snapshot_done = threading.Event()
        self._rejoining = False  # welcomed again after a reconnection, its snapshot still coming
        self._last_message = time.monotonic()
        self._stale = False

    # -- attaching ----------------------------------------------------------------------------------
    def connect(self) -> p.Welcome:
        """Attach (blocking, up to ``connect_timeout``); raise AttachError when refused or unanswered."""
        if self._thread is None:
            try:
                wire.credentials(self._token)
            except ValueError as exc:
                raise AttachError(f"cannot attach to {self.endpoint}: {exc}") from None
            self._thread = threading.Thread(target=self._run, name="graphtop-viewer-io", daemon=True)
            self._thread.start()
        if not self._welcomed.wait(self.connect_timeout):
            self.shutdown()
            raise AttachError(f"no graphtop engine answered at {self.endpoint} within {self.connect_timeout:g}s")
        if self._refused is not None:
            self.shutdown()
            raise AttachError(f"{self.endpoint} refused this viewer: {self._refused}")
        if self.welcome is None:  # the I/O thread ended first: ``_ended`` says why (a ZeroMQ error)
            self.shutdown()
            raise AttachError(self._ended or f"{self.endpoint} closed before it said who it is")
        return self.welcome

    def start(self) -> None:
        """Attach, then wait until the engine is loaded (its load and capture stream in meanwhile)."""
        self.connect()
        while not self._stop.is_set():
            status = self.status
            if status.failed:
                raise SessionError(status.failed)
            if status.ready or self._ended:
                return
            time.sleep(0.05)

    # -- Session protocol ---------------------------------------------------------------------------
    def drain(self, max_items: Optional[int] = None) -> list[Event]:
        return self.stream.drain(max_items)

    @property
    def dropped(self) -> int:
        return self.stream.dropped

    @property
    def gaps(self) -> int:
        """Events the stream's numbering says this viewer missed (part of ``dropped``)."""
        return self.stream.gaps

    @property
    def can_submit(self) -> bool:
        return self.status.ready and self._ended is None and self.welcome is not None

    @property
    def chat_available(self) -> bool:
        return self.status.chat

    @property
    def ended(self) -> Optional[str]:
        return self._ended

    def submit(self, prompt: str, settings: SamplingSettings, chat: bool) -> Any:
        """Send ``prompt`` to the engine; before the engine is ready it is held (``PromptQueue``) and
        sent, in order, once the engine says it is ready. Raises only when it never will be."""
        return self.prompts.submit(prompt, settings, chat)

    def _submit_now(self, prompt: str, settings: SamplingSettings, chat: bool) -> RemoteHandle:
        if self._ended is not None:
            raise RuntimeError(self._ended)
        handle = RemoteHandle(f"{self.name}-{next(self._ids)}", self)
        payload = p.encoder.encode(p.Submit(handle.request_id, prompt, settings, chat and self.chat_available))
        if len(payload) > p.MAX_MESSAGE_BYTES:  # the endpoint would refuse it: say so now, send nothing
            raise ValueError(
                f"the prompt is {len(payload):,} bytes as a message; the engine's endpoint takes "
                f"at most {p.MAX_MESSAGE_BYTES:,} (1 MiB): send a shorter prompt"
            )
        handle.sent_bytes = len(payload)
        self._handles[handle.request_id] = handle
        self._outbox.put(payload)
        return handle

    def cancel(self, request_id: str) -> None:
        self._send(p.Cancel(request_id))

    def recapture(self, decode_bs: Optional[list[int]], prefill_num_tokens: Optional[list[int]]) -> None:
        if not self.can_submit:
            raise RuntimeError(self._ended or "the engine is still loading")
        self._send(p.Recapture(next(self._ids), decode_bs, prefill_num_tokens))

    def export_trace_on_engine(self, path: str, timeout: float = 30.0) -> str:
        """Ask the engine to write the events it retains to ``path`` (a new file on its host)."""
        cid = next(self._ids)
        self._send(p.ExportTrace(cid, path))
        with self._result_ready:
            if not self._result_ready.wait_for(lambda: cid in self._results, timeout):
                raise TimeoutError(f"the engine did not answer the export within {timeout:g}s")
            result = self._results.pop(cid)
        if not result.ok:
            raise RuntimeError(result.message)
        return result.message

    @property
    def parity_every(self) -> int:
        """Graph steps per parity check (0: off): what this viewer asked for, else what the engine
        said when it last sent its status."""
        return self._parity_every if self._parity_every is not None else self.status.parity_every

    def set_parity_every(self, every: int) -> None:
        if not self.can_submit:
            raise RuntimeError(self._ended or "the engine is still loading")
        if every < 0:
            raise ValueError(f"parity every must be >= 0, got {every}")
        self._parity_every = every
        self._send(p.SetParity(next(self._ids), every))

    def buckets(self) -> tuple[Optional[list[int]], Optional[list[int]]]:
        return None, None  # the app reads them from the capture events

    def limits(self) -> Limits:
        return Limits(self.status.max_running, self.status.kv_capacity_tokens)

    def drain_logs(self) -> list[tuple[int, str]]:
        out = []
        while self._logs:
            out.append(self._logs.popleft())
        return out

    def shutdown(self) -> None:
        """Detach (the engine keeps running) and stop the I/O thread. Idempotent."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)

    # -- I/O thread ---------------------------------------------------------------------------------
    def _send(self, message: Any) -> None:
        self._outbox.put(p.encoder.encode(message))

    def _run(self) -> None:
        ctx = zmq.Context()
        sock = wire.viewer_socket(ctx, self._token, self.name)  # connect() checked the token's length
        watch = wire.HandshakeWatch(sock, self.endpoint)
        hello = p.encoder.encode(p.Hello(p.PROTOCOL_VERSION, self._token, self.name))
        try:
            sock.connect(self.endpoint)
            sock.send(hello, zmq.NOBLOCK)  # queued: goes out once the first handshake passes
            poller = zmq.Poller()
            poller.register(sock, zmq.POLLIN)
            poller.register(watch.monitor, zmq.POLLIN)
            said_hello = 1  # the handshakes this viewer's Hellos went out after (the queued one: the first)
            next_check = 0.0
            while not self._stop.is_set():
                if sock in dict(poller.poll(20)):
                    self._receive(sock)
                refused = watch.failure()
                if refused is not None:  # said in the handshake: no message will ever come
                    self._refused = self._refused or refused
                    self._ended = self._ended or f"{self.endpoint} refused this viewer: {refused}"
                    break
                if watch.succeeded > said_hello:
                    # reconnected after a handshake that passed: the endpoint knows a viewer by its
                    # connection, so this one says Hello again. Not welcomed yet: the Hello went out on a
                    # connection the endpoint shut (too many in their handshake at once) and is lost with
                    # it (one still queued goes too: the endpoint ignores a Hello said twice). Welcomed:
                    # the endpoint would send nothing to the new connection until it hears Hello there.
                    said_hello = watch.succeeded
                    sock.send(hello, zmq.NOBLOCK)
                while self.welcome is not None:  # commands only once attached: before, they are refused
                    try:
                        sock.send_multipart(wire.frames(self._outbox.get_nowait()), zmq.NOBLOCK)
                    except (queue.Empty, zmq.Again):
                        break
                now = time.monotonic()
                if now >= next_check:
                    next_check = now + 0.5
                    self._check_liveness(now)
            if self.welcome is not None and self._refused is None:
                sock.send(p.encoder.encode(p.Bye()), zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # zmq's own text repeats the address: the errno's alone reads better
            reason = zmq.strerror(exc.errno) if exc.errno else str(exc)
            self._ended = self._ended or f"connection to {self.endpoint} failed: {reason}"
        finally:
            self._welcomed.set()  # a connect() still waiting learns that it failed
            self.prompts.fail(self._ended or "the dashboard detached")  # held prompts will never go now
            watch.close()
            sock.close()
            ctx.term()

    def _check_liveness(self, now: float) -> None:
        if self.owner_pid is not None and os.getppid() != self.owner_pid and self._ended is None:
            self._ended = "the graphtop process that opened this dashboard has exited"
        silent = now - self._last_message > STALE_AFTER_S
        if silent and not self._stale and self.welcome is not None and self._ended is None:
            self._logs.append((logging.WARNING, f"no word from the engine for {STALE_AFTER_S:g} s"))
        self._stale = silent
        if silent and self._ended is None and self.welcome is not None and self._engine_exited(self.welcome):
            # killed (SIGKILL, the OOM killer): no Closing came, and the picture froze with no lasting word
            self._ended = f"the engine (pid {self.welcome.pid}) exited without closing its endpoint"

    def _engine_exited(self, welcome: p.Welcome) -> bool:
        """Whether the engine's process is known to be gone: only for an endpoint on this host (an ipc://
        socket), where its pid means something; a remote engine can only go silent."""
        if not self.endpoint.startswith("ipc://"):
            return False
        return not process_alive(welcome.pid, welcome.started)

    @property
    def silent_for(self) -> Optional[float]:
        """Seconds without a message, once past ``STALE_AFTER_S`` (the engine's heartbeat is every second)."""
        if not self._stale or self._ended is not None or self.welcome is None:
            return None
        return time.monotonic() - self._last_message

    def _receive(self, sock: zmq.Socket, limit: int = 500) -> None:
        for _ in range(limit):
            try:
                payload = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._last_message = time.monotonic()
            try:
                msg = p.server_decoder.decode(payload)
            except (msgspec.DecodeError, msgspec.ValidationError):
                self.stream.undecodable += 1
                continue
            self._handle(msg)

    def _handle(self, msg: Any) -> None:
        if isinstance(msg, p.RawEvents):
            self.stream.on_events(msg)
        elif isinstance(msg, p.Tokens):
            handle = self._handles.get(msg.request_id)
            if handle is not None:
                handle._feed(msg)
                if msg.finished:
                    del self._handles[msg.request_id]
        elif isinstance(msg, p.RawSnapshot):
            if not self._rejoining:  # a rejoin's snapshot holds what this viewer was shown already
                self.stream.push(msg.events)
            if msg.done:
                self._rejoining = False
                self.snapshot_done.set()
        elif isinstance(msg, p.Welcome):
            if msg.protocol != p.PROTOCOL_VERSION:  # its messages would be read by this version's rules
                self._ended = (
                    f"{self.endpoint} speaks telemetry protocol {msg.protocol}, this viewer's "
                    f"{p.PROTOCOL_VERSION}: attach with the graphtop version that runs the engine"
                )
                self._welcomed.set()
                return
            if msg.next_seq < 0 or msg.bus_dropped < 0:  # counters that can only count up from 0
                self._refused = (
                    f"it sent a malformed Welcome (next_seq {msg.next_seq}, "
                    f"bus_dropped {msg.bus_dropped}; not a graphtop engine?)"
                )
                self._welcomed.set()
                return
            if self.welcome is not None:  # welcomed again after a reconnection: the stream goes on
                self._rejoining = self.snapshot_done.is_set()
                self._logs.append((logging.WARNING, "reconnected to the engine; what it sent meanwhile is missed"))
                self._on_status(msg.status)
                return
            self.welcome = msg
            self.stream.welcome(msg.next_seq, msg.bus_dropped)
            self._logs.extend(msg.logs)
            self._on_status(msg.status)
            self._welcomed.set()
        elif isinstance(msg, p.Status):
            self._on_status(msg.status)
        elif isinstance(msg, p.Result):
            if not msg.ok:
                self._logs.append((logging.ERROR, f"command refused: {msg.message}"))
            with self._result_ready:
                self._results[msg.cid] = msg
                if len(self._results) > 100:  # answers nobody waits for (recaptures) do not pile up
                    self._results.pop(next(iter(self._results)))
                self._result_ready.notify_all()
        elif isinstance(msg, p.Log):
            self._logs.append((msg.level, msg.message))
        elif isinstance(msg, p.Refused):
            if self.welcome is None:
                self._refused = msg.reason
                self._welcomed.set()
            else:
                self._logs.append((logging.WARNING, f"the engine refused a message: {msg.reason}"))
                self._fail_refused_submit(msg)
        elif isinstance(msg, p.Closing):
            self.prompts.fail(msg.reason)
            if self.welcome is not None:
                self._ended = msg.reason
            else:  # a connect() still waiting reports it now, not after its timeout
                self._ended = f"{self.endpoint} is closing: {msg.reason}"
                self._welcomed.set()

    def _fail_refused_submit(self, msg: p.Refused) -> None:
        """A size refusal carries the refused message's size: the unanswered submit of that size fails
        with the reason (its view would otherwise say "streaming…" forever). ``Refused`` names no
        request, and the size is exact (the endpoint measures the same bytes)."""
        if msg.message_bytes is None:
            return
        for rid, handle in list(self._handles.items()):
            if handle.sent_bytes == msg.message_bytes and not handle.answered:
                del self._handles[rid]
                handle._feed(p.Tokens(rid, "", True, "rejected", msg.reason))
                return

    def _on_status(self, status: p.EngineStatus) -> None:
        """Held prompts go out once the engine is ready, and fail if it never will be."""
        self.status = status
        if status.failed:
            self.prompts.fail(status.failed)
        elif status.ready and self._ended is None:
            self.prompts.release(self._submit_now)
