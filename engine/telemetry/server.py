"""The telemetry endpoint: the engine's events out to viewers in other processes, commands back.

The engine thread only builds events (as for the recorder); everything else runs on one publisher
thread that wakes per batch (every ``flush_interval_s``, or at once when a viewer writes): it drains
a bounded bus subscription, numbers and folds the events into a :class:`StateKeeper`, encodes each
batch once with msgspec and hands it to ZeroMQ without blocking. A viewer that is slow, stuck or
killed costs the engine nothing: its ZeroMQ queue fills (``send_hwm`` messages) and further batches
for it are dropped and counted, or it is gone and forgotten. Viewers see every loss as a gap in the
event numbers. The publisher thread shares the GIL with the engine's: it works in chunks of
``EVENTS_PER_MESSAGE`` events and hands the GIL over between two (``let_the_engine_run``), so a backlog or
a new viewer's snapshot never holds the engine's thread up for more than one chunk.

Transport: one ROUTER socket; each viewer is a DEALER that gives the endpoint's token in ZeroMQ's
handshake (checked by the :class:`~.gate.Gate`: a peer without it is never handed to the endpoint, and
the number of peers in their handshake is capped), then sends ``Hello`` and gets ``Welcome``, the
snapshot, then the live stream. Messages travel in frames of at most ``wire.FRAME_BYTES``, joined here.
By default the socket is a Unix socket in the private runtime folder (see ``runtime``);
``tcp://HOST:PORT`` is opt-in. Anything a client sends that is not a well-formed message from an
attached viewer is refused and logged (a warning on ``graphtop.telemetry`` and an ``error`` event, both
rate-limited), never raised into the engine.

Commands go to a :class:`CommandDesk` (``endpoint_commands``) and from there to the engine's link. The
server exists before the engine may be loaded (``graphtop --model`` shows the load in the viewer), so
the link is attached later.
"""

from __future__ import annotations

import atexit
import hmac
import itertools
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import msgspec
import zmq

from . import protocol as p
from .bus import EventBus
from .descriptors import make_room_for
from .endpoint_commands import CommandDesk, EngineLink, Viewer
from .events import ErrorEvent, Event
from .gate import Gate, GateConfig
from .log_forward import LogForwarder
from .plain_text import one_line
from .runtime import (
    EndpointEntry,
    EndpointError,
    check_tcp_port,
    entry_stem,
    ipc_address,
    new_token,
    private_dir,
    remove_entry,
    write_entry,
)
from .state_keeper import REFUSAL_WHERE, StateKeeper

log = logging.getLogger("graphtop.telemetry")

MAX_VIEWERS = 1024
"""Viewers attached to one endpoint at once; a ``Hello`` past it is refused with the reason. Each one is a
connection (a file descriptor: the endpoint raises the process's soft limit to fit, see ``descriptors``)
and a ZeroMQ queue of at most ``send_hwm`` batches."""
_SERIALS = itertools.count()


@dataclass(frozen=True)
class EndpointConfig:
    """``address``: "ipc" (a socket in the private runtime folder) or "tcp://HOST:PORT" (PORT may be *)."""

    address: str = "ipc"
    runtime_dir: Optional[Path] = None
    label: str = ""
    queue_size: int = 100_000
    flush_interval_s: float = 0.05  # the dashboard draws at most 15 times a second (4 while the engine is busy)
    heartbeat_s: float = 1.0
    send_hwm: int = 256
    max_message_bytes: int = p.MAX_MESSAGE_BYTES
    recent_steps: int = 4096
    refusals_per_s: float = 2.0
    max_pending: int = 32  # connections in their handshake at once (see ``gate`` and ``handshakes``)
    handshake_s: float = 5.0  # a connection that has not passed the handshake by then is dropped
    patience_s: float = 1.0  # a handshake this old gives way to a newcomer when ``max_pending`` are in one
    max_viewers: int = MAX_VIEWERS


def let_the_engine_run() -> None:
    """Give up the GIL between two chunks of the publisher's work (folding, encoding, sending
    ``EVENTS_PER_MESSAGE`` events). Without it a backlog or a new viewer's snapshot is encoded in one go,
    and the engine's thread, back from waiting on the device, waits for the GIL until the interpreter's
    switch interval (5 ms) takes it from this thread: a step gap the device waits through."""
    time.sleep(0)


class TelemetryServer:
    """Serves ``bus`` on an endpoint until ``close()``; see the module docstring."""

    def __init__(self, bus: EventBus, config: EndpointConfig = EndpointConfig()) -> None:
        self.bus = bus
        self.config = config
        self.folder = private_dir(config.runtime_dir)
        self._stem = entry_stem(os.getpid(), next(_SERIALS))
        self.token = new_token()
        self.started = time.time()
        self._ctx = zmq.Context()
        self.gate = Gate(self._ctx, GateConfig(self.token, config.max_pending, config.handshake_s, config.patience_s))
        make_room_for(config.max_viewers + config.max_pending)
        self._sock = self._bind(self._resolve_address(config.address))
        self.endpoint: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.gate.watch(self._sock, self.endpoint)
        if self.endpoint.startswith("ipc://"):
            os.chmod(self.endpoint[len("ipc://") :], 0o600)
        self._entry = EndpointEntry(os.getpid(), self.endpoint, self.token, config.label, "", self.started)
        write_entry(self.folder, self._stem, self._entry)
        self.keeper = StateKeeper(recent_steps=config.recent_steps)
        self.viewers: dict[bytes, Viewer] = {}
        self.commands = CommandDesk(
            lambda viewer, message: self._send(viewer, p.encoder.encode(message)), self.keeper.snapshot
        )
        self._seed: list[Event] = []
        self._status_changed = False
        self.refused = 0
        self._refusal_budget = config.refusals_per_s
        self._refusal_clock = time.monotonic()
        self._last_heartbeat = 0.0
        self._read_all_at = time.monotonic()
        self.logs = LogForwarder()
        self.logs.install()
        self._sub = bus.subscribe("telemetry-endpoint", maxsize=config.queue_size)
        self._stop = threading.Event()
        self._closed = False
        self._closing_reason = "the engine stopped serving telemetry"
        self._thread = threading.Thread(target=self._run, name="graphtop-telemetry", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    # -- setup ------------------------------------------------------------------------------------
    def _resolve_address(self, address: str) -> str:
        if address == "ipc":
            return ipc_address(self.folder, self._stem)
        if address.startswith("tcp://"):
            check_tcp_port(address, wildcard=True)
            return address
        raise EndpointError(f"telemetry address {address!r}: use ipc (the default) or tcp://HOST:PORT")

    def _bind(self, address: str) -> zmq.Socket:
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a full or vanished viewer raises, so it is counted
        sock.setsockopt(zmq.SNDHWM, self.config.send_hwm)
        sock.setsockopt(zmq.RCVHWM, 1000)
        sock.setsockopt(zmq.LINGER, 100)
        sock.setsockopt(zmq.HEARTBEAT_IVL, 2000)  # dead TCP peers are noticed, not waited on
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 10_000)
        self.gate.secure(sock)
        try:
            sock.bind(address)
        except zmq.ZMQError as exc:
            sock.close(0)
            self.gate.close()
            self._ctx.term()
            raise EndpointError(f"cannot serve telemetry on {address}: {exc}") from None
        return sock

    # -- the engine side's calls (any thread) -------------------------------------------------------
    def attach_engine(self, link: EngineLink) -> None:
        """Commands go to ``link`` from now on; viewers learn the engine is ready."""
        self._seed = link.state_events()
        self.commands.link = link
        status = link.status()
        self._entry.model, self._entry.device = status.model or self._entry.model, status.device
        write_entry(self.folder, self._stem, self._entry)
        self._status_changed = True

    def engine_failed(self, message: str) -> None:
        """The engine could not be loaded: viewers show ``message`` (as a fatal error event)."""
        self.commands.failed = message
        self.bus.publish(ErrorEvent(message=message, where="load", fatal=True))
        self._status_changed = True

    def status(self) -> p.EngineStatus:
        link = self.commands.link
        if link is not None:
            return link.status()
        return p.EngineStatus(ready=False, failed=self.commands.failed, model=self.config.label)

    @property
    def dropped(self) -> int:
        """Events the endpoint's own bus queue lost (every viewer misses those)."""
        return self._sub.dropped

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, reason: str = "the engine stopped serving telemetry") -> None:
        """Tell viewers, stop the thread, release the socket and the runtime entry. Idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        self._closing_reason = reason
        self._stop.set()
        self._thread.join(10.0)
        self.commands.close()
        self.bus.unsubscribe(self._sub)
        self.logs.uninstall()
        remove_entry(self.folder, self._stem)

    def __enter__(self) -> "TelemetryServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- publisher thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        for sock in [self._sock, *self.gate.sockets]:
            poller.register(sock, zmq.POLLIN)
        timeout_ms = max(1, int(self.config.flush_interval_s * 1000))
        try:
            while not self._stop.is_set():
                try:
                    # Only a socket the poll found readable is read: a read that finds nothing costs as much
                    # as one that finds a message (ZeroMQ raises Again), and three of them on every batch were
                    # most of what serving cost an engine nobody sent anything to.
                    polled_at = time.monotonic()
                    ready = {sock for sock, _ in poller.poll(timeout_ms)}
                    if self.gate.zap in ready:  # handshakes first: a viewer waits on its answer
                        for reason in self.gate.answer():
                            self._refuse(None, reason)
                    self._publish()  # first, so a viewer saying Hello now gets a snapshot up to now
                    if self._sock in ready:  # before the gate counts connections: a Hello read frees a place
                        self._receive()
                    else:
                        self._read_all_at = polled_at  # nothing was waiting when the poll looked
                    if self.gate.monitor in ready:
                        for reason in self.gate.follow(self._read_all_at):
                            self._refuse(None, reason)
                    self._tick()
                except Exception:  # the endpoint must outlive any bug in it, and never stop the engine
                    log.exception("telemetry endpoint: unexpected error (serving continues)")
                    self._stop.wait(0.1)
            self._tick()
            self._broadcast(p.encoder.encode(p.Closing(self._closing_reason)))
        finally:
            self.gate.close()
            self._sock.close()
            self._ctx.term()

    def _tick(self) -> None:
        self._publish()
        self.commands.stream_tokens()
        if self._status_changed:
            self._status_changed = False
            self._broadcast(p.encoder.encode(p.Status(self.status())))
        for level, message in self.logs.drain():
            self._broadcast(p.encoder.encode(p.Log(level, message)))
        now = time.monotonic()
        if now - self._last_heartbeat >= self.config.heartbeat_s:
            self._last_heartbeat = now
            beat = p.encoder.encode(p.Events(self.keeper.next_seq, self._sub.dropped, []))
            for viewer in list(self.viewers.values()):
                if now - viewer.last_sent >= self.config.heartbeat_s:
                    self._send(viewer, beat)

    def _publish(self) -> None:
        events = self._sub.drain()
        seed, self._seed = self._seed, []
        if seed and not self.keeper.has_started and not any(ev.type == "engine_started" for ev in events):
            events = seed + events  # served after the engine started: catch up from its state
        step = p.EVENTS_PER_MESSAGE
        for i in range(0, len(events), step):
            if i:
                let_the_engine_run()
            chunk = events[i : i + step]
            first = self.keeper.next_seq
            self.keeper.fold_all(chunk)
            if not self.viewers:
                continue
            payload = p.encoder.encode(p.Events(first, self._sub.dropped, p.event_pairs(chunk)))
            for viewer in list(self.viewers.values()):
                self._send(viewer, payload, len(chunk))

    def _send(self, viewer: Viewer, payload: bytes, events: int = 0) -> bool:
        try:
            self._sock.send_multipart([viewer.identity, payload], flags=zmq.NOBLOCK)
        except zmq.Again:  # its queue is full: this viewer misses the batch (it sees the gap)
            viewer.dropped_events += events
            return False
        except zmq.ZMQError:  # EHOSTUNREACH: the viewer is gone
            self._detach(viewer)
            return False
        viewer.sent_events += events
        viewer.last_sent = time.monotonic()
        return True

    def _broadcast(self, payload: bytes) -> None:
        for viewer in list(self.viewers.values()):
            self._send(viewer, payload)

    def _reply(self, identity: bytes, message: Any) -> None:
        try:
            self._sock.send_multipart([identity, p.encoder.encode(message)], flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # a client that cannot take a reply gets none

    # -- incoming -----------------------------------------------------------------------------------
    def _receive(self, limit: int = 256) -> None:
        started = time.monotonic()
        for _ in range(limit):
            try:
                parts = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                self._read_all_at = started  # what had come by then is read (the gate's patience counts to it)
                return
            frames = [part.bytes for part in parts]
            identity = frames[0]
            size = sum(map(len, frames[1:]))  # a message longer than a frame comes in several (``wire``)
            if size > self.config.max_message_bytes:
                self._refuse(
                    identity,
                    f"message of {size} bytes is over the {self.config.max_message_bytes}-byte limit",
                    message_bytes=size,
                )
                continue
            payload = b"".join(frames[1:])
            try:
                msg = p.client_decoder.decode(payload)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                self._refuse(identity, f"malformed message: {str(exc)[:120]}")
                continue
            viewer = self.viewers.get(identity)
            if isinstance(msg, p.Hello):
                if viewer is None:  # its connection passed the handshake: it no longer counts as pending
                    self.gate.passed(parts[0].get(zmq.SRCFD))
                self._hello(identity, msg)
            elif viewer is None and isinstance(msg, p.Bye):
                continue  # a viewer that left while a batch for it was found undeliverable
            elif viewer is None:
                self._refuse(identity, f"{type(msg).__name__} from a client that has not attached (send Hello first)")
            else:
                self._command(viewer, msg)

    def _refuse(
        self, identity: Optional[bytes], reason: str, *, reply: bool = True, message_bytes: Optional[int] = None
    ) -> None:
        """Count, log (rate-limited) and answer ``Refused``; the engine never sees the message.

        The reason may quote the client (a tag msgspec did not know): one printable line, so nobody
        can add lines to the engine's log or to the error events every viewer gets."""
        reason = one_line(reason)
        self.refused += 1
        now = time.monotonic()
        rate = self.config.refusals_per_s
        self._refusal_budget = min(rate, self._refusal_budget + (now - self._refusal_clock) * rate)
        self._refusal_clock = now
        if self._refusal_budget >= 1.0:
            self._refusal_budget -= 1.0
            log.warning("telemetry endpoint refused a client: %s", reason)
            self.bus.publish(ErrorEvent(message=f"refused a client: {reason}", where=REFUSAL_WHERE))
        if reply and identity is not None:
            self._reply(identity, p.Refused(reason, message_bytes))

    def _hello(self, identity: bytes, msg: p.Hello) -> None:
        if msg.protocol != p.PROTOCOL_VERSION:
            self._refuse(identity, f"protocol {msg.protocol} is not {p.PROTOCOL_VERSION} (another graphtop version?)")
            return
        if not hmac.compare_digest(msg.token.encode(), self.token.encode()):
            self._refuse(identity, "wrong token")
            return
        if identity in self.viewers:  # said again on the same connection (a viewer's retry): welcomed already
            return
        if len(self.viewers) >= self.config.max_viewers:
            self._refuse(identity, f"{len(self.viewers)} viewers are attached, the most this endpoint serves at once")
            return
        viewer = Viewer(identity, msg.name[:64], time.time())
        self._reply(
            identity,
            p.Welcome(
                p.PROTOCOL_VERSION,
                os.getpid(),
                self.config.label,
                self.started,
                self.status(),
                self.keeper.next_seq,
                self._sub.dropped,
                self.logs.recent(),
            ),
        )
        events = self.keeper.snapshot()
        step = p.EVENTS_PER_MESSAGE
        for i in range(0, max(len(events), 1), step):
            if i:
                let_the_engine_run()
            chunk = events[i : i + step]
            if not self._send(
                viewer, p.encoder.encode(p.Snapshot(p.event_pairs(chunk), i + step >= len(events))), len(chunk)
            ):
                return
        self.viewers[identity] = viewer

    def _detach(self, viewer: Viewer) -> None:
        self.viewers.pop(viewer.identity, None)
        self.commands.forget(viewer)

    def _command(self, viewer: Viewer, msg: Any) -> None:
        if isinstance(msg, p.Bye):
            self._detach(viewer)
        elif not isinstance(msg, p.Ping):
            refusal = self.commands.handle(viewer, msg)
            if refusal:  # answered: the viewer logs it (a cancel it cannot give is said, not swallowed)
                self._refuse(viewer.identity, refusal)
