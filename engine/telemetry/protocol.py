"""The telemetry endpoint's wire protocol: typed messages, encoded with msgpack by msgspec.

One ZeroMQ ROUTER socket in the engine process, one DEALER per viewer; every ZeroMQ message holds one
of the message structs below (tagged by ``kind``), in one frame or, past ``wire.FRAME_BYTES``, several.
Both ends decode with a typed ``msgspec`` decoder, so a malformed or unexpected message fails in one
place as a ``msgspec.DecodeError``/``ValidationError`` instead of reaching engine code.

Events travel as ``(type tag, event)`` pairs: the sender encodes the event dataclasses as they are
(no ``to_dict`` copy), the receiver decodes each one into its class with a per-type decoder.
``seq`` numbers events in stream order, so a viewer can count exactly what it missed.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Optional, Union, get_type_hints

import msgspec

from ..sampling_params import SamplingParams
from .events import EVENT_TYPES, Event

PROTOCOL_VERSION = 2
"""2: the token is checked in ZeroMQ's handshake (PLAIN) and long messages come in frames (``wire``)."""

MAX_MESSAGE_BYTES = 1 << 20
"""Largest client message the server reads (a prompt is at most this big); larger ones are refused. It
travels in frames of at most ``wire.FRAME_BYTES``: ZeroMQ drops a peer that sends a longer frame."""

EVENTS_PER_MESSAGE = 512
"""Events per ``Events``/``Snapshot`` message: bounds the time the encoder holds the GIL at once."""


# -- the engine's state as a viewer needs it -----------------------------------------------------


class EngineStatus(msgspec.Struct, frozen=True):
    """Whether the engine can take commands yet, and the limits the bucket editor checks."""

    ready: bool = False
    failed: Optional[str] = None
    model: str = ""
    device: str = ""
    chat: bool = False
    max_running: Optional[int] = None
    kv_capacity_tokens: Optional[int] = None
    parity_every: int = 0  # graph steps per parity check (0: off)


def _sampling_struct() -> type:
    """The wire's copy of ``SamplingParams``, made from its fields (names, types, defaults), so a new
    sampling parameter reaches the wire, and the dashboard that sends it, without a line here. Values at
    their default are left out of the message; a peer that does not know a field ignores it."""

    def to_params(self: Any) -> SamplingParams:
        """The engine's ``SamplingParams``: its ``SamplingParamError`` (one line) where its rules refuse a
        value, the one home of those rules."""
        return SamplingParams(**msgspec.structs.asdict(self))

    hints = get_type_hints(SamplingParams)
    return msgspec.defstruct(
        "Sampling",
        [(f.name, hints[f.name], f.default) for f in fields(SamplingParams) if f.init],
        namespace={"to_params": to_params, "__doc__": "A prompt's sampling settings, as ``SamplingParams``."},
        module=__name__,
        frozen=True,
        kw_only=True,
        omit_defaults=True,
    )


Sampling = _sampling_struct()
"""A prompt's sampling settings as a viewer sends them: ``SamplingParams``' fields, checked by it
(``to_params``) on the engine's side."""


# -- viewer -> engine ----------------------------------------------------------------------------


class Hello(msgspec.Struct, frozen=True, tag=True):
    protocol: int
    token: str
    name: str = ""


class Ping(msgspec.Struct, frozen=True, tag=True):
    pass


class Bye(msgspec.Struct, frozen=True, tag=True):
    pass


class Submit(msgspec.Struct, frozen=True, tag=True):
    request_id: str
    prompt: str
    sampling: Sampling = Sampling()
    chat: bool = False


class Cancel(msgspec.Struct, frozen=True, tag=True):
    request_id: str


class Recapture(msgspec.Struct, frozen=True, tag=True):
    cid: int
    decode_bs: Optional[list[int]] = None
    prefill_num_tokens: Optional[list[int]] = None


class ExportTrace(msgspec.Struct, frozen=True, tag=True):
    """Write the events the engine retains (what a viewer attaching now would get) to ``path``,
    a new file on the engine's host."""

    cid: int
    path: str


class SetParity(msgspec.Struct, frozen=True, tag=True):
    """Check one graph step in ``every`` against an eager re-run (0: off)."""

    cid: int
    every: int


ClientMessage = Union[Hello, Ping, Bye, Submit, Cancel, Recapture, ExportTrace, SetParity]


# -- engine -> viewer ----------------------------------------------------------------------------


class Welcome(msgspec.Struct, frozen=True, tag=True):
    protocol: int
    pid: int
    label: str
    started: float
    status: EngineStatus
    next_seq: int
    bus_dropped: int
    logs: list[tuple[int, str]] = []


class Refused(msgspec.Struct, frozen=True, tag=True):
    reason: str
    message_bytes: Optional[int] = None
    """The refused message's size when it was refused for its size: a viewer matches it to the submit it
    sent (a refusal names no request), whose view would otherwise stream forever. Older viewers ignore it."""


class Snapshot(msgspec.Struct, frozen=True, tag=True):
    """Part of what the engine retains (``done`` on the last part); the live stream follows."""

    events: list[tuple[str, Any]]
    done: bool


class Events(msgspec.Struct, frozen=True, tag=True):
    """Events ``first_seq .. first_seq + len(events) - 1``; ``bus_dropped`` counts events the
    endpoint's own queue lost before numbering (an empty batch is the heartbeat)."""

    first_seq: int
    bus_dropped: int
    events: list[tuple[str, Any]]


class Status(msgspec.Struct, frozen=True, tag=True):
    status: EngineStatus


class Tokens(msgspec.Struct, frozen=True, tag=True):
    """New text of a prompt this viewer submitted."""

    request_id: str
    text: str
    finished: bool = False
    finish_reason: Optional[str] = None
    error: Optional[str] = None


class Result(msgspec.Struct, frozen=True, tag=True):
    """Outcome of a command that has no stream of its own (recapture, export, parity)."""

    cid: int
    ok: bool
    message: str = ""


class Log(msgspec.Struct, frozen=True, tag=True):
    level: int
    message: str


class Closing(msgspec.Struct, frozen=True, tag=True):
    reason: str


ServerMessage = Union[Welcome, Refused, Snapshot, Events, Status, Tokens, Result, Log, Closing]


# -- codecs --------------------------------------------------------------------------------------


def _fallback(obj: Any) -> Any:
    """Values msgpack has no type for (only possible in ``Any``/``dict`` event fields) travel as text,
    as they do in traces."""
    return str(obj)


encoder = msgspec.msgpack.Encoder(enc_hook=_fallback)
client_decoder = msgspec.msgpack.Decoder(ClientMessage)


class RawEvents(msgspec.Struct, frozen=True, tag="Events"):
    """``Events`` as the viewer receives it: events still encoded, decoded by ``decode_events``."""

    first_seq: int
    bus_dropped: int
    events: list[tuple[str, msgspec.Raw]]


class RawSnapshot(msgspec.Struct, frozen=True, tag="Snapshot"):
    """``Snapshot`` as the viewer receives it."""

    events: list[tuple[str, msgspec.Raw]]
    done: bool


_ViewerMessage = Union[Welcome, Refused, RawSnapshot, RawEvents, Status, Tokens, Result, Log, Closing]
server_decoder = msgspec.msgpack.Decoder(_ViewerMessage)
"""The viewer's decoder: event batches keep their events raw until ``decode_events``."""

_EVENT_DECODERS = {tag: msgspec.msgpack.Decoder(cls) for tag, cls in EVENT_TYPES.items()}


def event_pairs(events: list[Event]) -> list[tuple[str, Any]]:
    return [(ev.type, ev) for ev in events]


def decode_events(pairs: list[tuple[str, msgspec.Raw]]) -> tuple[list[Event], int]:
    """Events of a batch, and how many could not be decoded (unknown type, wrong fields)."""
    out: list[Event] = []
    bad = 0
    for tag, raw in pairs:
        dec = _EVENT_DECODERS.get(tag)
        if dec is None:
            bad += 1
            continue
        try:
            out.append(dec.decode(raw))
        except (msgspec.DecodeError, msgspec.ValidationError):
            bad += 1
    return out, bad
