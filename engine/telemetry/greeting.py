"""The security mechanism an endpoint announces in its ZeroMQ greeting, read over a plain socket.

Why: a viewer (PLAIN) that reaches an endpoint of protocol 1 (NULL) fails the handshake, but which side
notices first is a race. When the endpoint does, it closes the connection before the viewer has read the
endpoint's greeting, and ZeroMQ reports only a handshake failure with no detail, then reconnects. On a
loaded machine the viewer lost that race for many seconds in a row, so it said nothing until its connect
timeout. A failure with no detail is also what the endpoint's connection cap gives a viewer during a
flood (engine/telemetry/gate.py), so it cannot be taken as a refusal by itself. The greeting settles it:
ZMTP 3 peers exchange a 64-byte greeting before anything else, the mechanism's name in octets 12-31. The
probe sends no mechanism at all: only the signature and the major version, after which an endpoint sends
the rest of its greeting and waits for the rest of ours, so it has nothing to refuse yet. (Given a whole
greeting at once, libzmq checks the mechanism before it has written a byte of its own.)
"""

from __future__ import annotations

import socket
from typing import Optional

GREETING_BYTES = 64
_SIGNATURE = b"\xff" + b"\x00" * 8 + b"\x7f"


def client_greeting(mechanism: bytes) -> bytes:
    """A ZMTP 3.1 greeting of a client using ``mechanism`` (signature, version, mechanism, as-server 0)."""
    return _SIGNATURE + b"\x03\x01" + mechanism.ljust(20, b"\x00") + b"\x00" + b"\x00" * 31


def announced_mechanism(endpoint: str, timeout: float = 1.0) -> Optional[str]:
    """The mechanism (``NULL``, ``PLAIN``, ``CURVE``) that ``endpoint`` (``ipc://PATH`` or ``tcp://HOST:PORT``)
    announces to a PLAIN client, or None when it cannot be read: nothing listens, the connection is shut
    before the greeting (a connection cap), the peer does not speak ZMTP 3, or another transport."""
    try:
        with _connect(endpoint, timeout) as sock:
            if sock is None:
                return None
            greeting = client_greeting(b"PLAIN")
            sock.sendall(greeting[:10])  # the signature
            data = _read(sock, 10)  # the endpoint's signature
            if data is None:
                return None
            sock.sendall(greeting[10:11])  # the major version: ZMTP 3, so the endpoint sends the rest
            rest = _read(sock, GREETING_BYTES - 10)
            if rest is None:
                return None
            data += rest
    except OSError:
        return None
    if data[:1] != b"\xff" or data[9:10] != b"\x7f" or data[10] < 3:
        return None
    return data[12:32].rstrip(b"\x00").decode("ascii", "replace") or None


def _read(sock: socket.socket, n: int) -> Optional[bytes]:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


class _NoSocket:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _connect(endpoint: str, timeout: float) -> "socket.socket | _NoSocket":
    if endpoint.startswith("ipc://"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(endpoint[len("ipc://") :])
        except OSError:
            sock.close()
            raise
        return sock
    if endpoint.startswith("tcp://"):
        host, _, port = endpoint[len("tcp://") :].rpartition(":")
        if not port.isdigit():
            return _NoSocket()
        return socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    return _NoSocket()
