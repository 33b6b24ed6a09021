"""How the telemetry endpoint's two ends set up their ZeroMQ sockets: the token is checked in ZeroMQ's own
handshake, and every message travels in frames of at most ``FRAME_BYTES``.

Why: ZeroMQ hands a multipart message over only once every part has arrived, and its ``MAXMSGSIZE``
bounds each part, never the message. An endpoint that read the token from the first message therefore
let anyone who could reach it make the engine's process buffer any amount first (one message of 30
parts of 15 MiB took an engine from 273 MB to 996 MB). So the viewer gives the token in the handshake
(ZeroMQ's PLAIN mechanism, username and password; ``gate`` answers it): until that is accepted, ZeroMQ
hands the engine no message at all, and reads at most one handshake frame of ``FRAME_BYTES`` from the
peer. The server's sockets refuse any frame past ``FRAME_BYTES`` (ZeroMQ drops the connection before
reading it), so a message longer than that (a long prompt) is cut into frames of that size and the
server joins them: the 1 MiB message limit (``protocol.MAX_MESSAGE_BYTES``) is unchanged.

PLAIN is not encryption: the token crosses a TCP endpoint in clear, as it did in ``Hello``.
"""

from __future__ import annotations

import time
from typing import Optional

import zmq

FRAME_BYTES = 64 << 10
"""Largest frame the endpoint reads (ZeroMQ's ``MAXMSGSIZE``): a peer that sends a longer one, in its
handshake or after it, is disconnected before the frame is buffered."""

ZAP_DOMAIN = "graphtop"
PLAIN_FIELD_BYTES = 255
"""The PLAIN mechanism's limit on a username or a password (one length byte on the wire)."""


def frames(payload: bytes) -> list[bytes]:
    """``payload`` cut into frames of at most ``FRAME_BYTES`` (one frame when it is that short)."""
    if len(payload) <= FRAME_BYTES:
        return [payload]
    return [payload[i : i + FRAME_BYTES] for i in range(0, len(payload), FRAME_BYTES)]


def credentials(token: str) -> bytes:
    """The token as the PLAIN password; ``ValueError`` (one line) when no endpoint can have it."""
    raw = token.encode("utf-8", "surrogateescape")
    if not raw or len(raw) > PLAIN_FIELD_BYTES:
        raise ValueError(f"wrong token: an endpoint's token is 1-{PLAIN_FIELD_BYTES} bytes, this one {len(raw)}")
    return raw


def viewer_socket(ctx: zmq.Context, token: str, name: str) -> zmq.Socket:
    """A viewer's DEALER, set up to pass the endpoint's handshake with ``token``."""
    password = credentials(token)
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 200)  # Bye gets out; a dead engine does not hold us longer
    sock.setsockopt(zmq.RCVHWM, 1000)
    sock.setsockopt(zmq.HEARTBEAT_IVL, 2000)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 10_000)
    sock.setsockopt(zmq.PLAIN_USERNAME, name.encode("utf-8", "replace")[:PLAIN_FIELD_BYTES] or b"viewer")
    sock.setsockopt(zmq.PLAIN_PASSWORD, password)
    return sock


OTHER_MECHANISM = (
    "its handshake is not this viewer's (an endpoint of another graphtop version, or not graphtop): attach "
    "with the graphtop version that runs the engine"
)
PROBE_EVERY_S = 1.0
"""At most one greeting probe (engine/telemetry/greeting.py) a second while handshakes fail with no detail."""


class HandshakeWatch:
    """What became of this viewer's handshakes, from the socket's monitor.

    A refused one says why: a wrong token (the endpoint's ZAP handler said no) or another mechanism (an
    endpoint of an older graphtop, or not graphtop); without it a refused viewer would only see silence
    until its connect timeout. The ones that passed are counted: a viewer that reconnects after one
    passed says ``Hello`` again, since its first went out on a connection the endpoint may have shut
    right after (its ``gate`` bounds the handshakes in progress, and can be a moment behind).

    Another mechanism is reported by ZeroMQ only when the viewer notices the mismatch first; when the
    endpoint does, the viewer sees a failure with no detail, as it does when a connection cap shuts it
    out. Such a failure asks the endpoint's greeting which mechanism it announces (``endpoint``, at most
    every ``PROBE_EVERY_S``): the answer does not depend on who noticed first."""

    _EVENTS = (
        zmq.EVENT_HANDSHAKE_FAILED_AUTH
        | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
        | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
        | zmq.EVENT_HANDSHAKE_SUCCEEDED
    )

    def __init__(self, sock: zmq.Socket, endpoint: Optional[str] = None) -> None:
        self._sock = sock
        self.endpoint = endpoint
        self.monitor = sock.get_monitor_socket(self._EVENTS)
        self.succeeded = 0
        """Handshakes passed so far (one per connection: ZeroMQ reconnects after a shut one)."""
        self._probed = float("-inf")

    def failure(self) -> Optional[str]:
        """The reason of a refused handshake since the last call, if any (blocks only for a probe, at most
        about a second); handshakes that passed meanwhile are counted in ``succeeded``."""
        from zmq.utils.monitor import recv_monitor_message

        no_detail = False
        while True:
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                break
            if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.succeeded += 1
            elif event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                return "wrong token"
            elif event["event"] == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                return OTHER_MECHANISM
            else:
                no_detail = True
        if no_detail and self.endpoint is not None and time.monotonic() - self._probed >= PROBE_EVERY_S:
            from .greeting import announced_mechanism

            self._probed = time.monotonic()
            mechanism = announced_mechanism(self.endpoint)
            if mechanism is not None and mechanism != "PLAIN":
                return OTHER_MECHANISM
        return None

    def close(self) -> None:
        self._sock.disable_monitor()
        self.monitor.close(0)
