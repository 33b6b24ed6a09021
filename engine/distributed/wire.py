"""What rank 0 sends its workers: one compact message per forward step, and rare control messages.

A forward step is the scheduler's decision (``ForwardBatch``) as plain int32 runs behind a fixed
header — ids, positions, KV slots, per-request lengths, page lists, sampled rows — so encoding is a
few ``array`` extends (the page lists are already int32 arrays) and decoding one ``frombytes``; no
per-request object is pickled. Control messages (setup, capture, recapture, stop) are rare and pickled.

Requests themselves never travel: a worker's batch has ``None`` placeholders where rank 0 has
``Request`` objects (runners and attention backends read only the lists; sampling stays on rank 0).
"""

from __future__ import annotations

import pickle
import struct
from array import array
from dataclasses import dataclass
from typing import Any, Optional

from ..batch import ForwardBatch, ForwardMode

FORWARD = b"F"
CONTROL = b"C"
_HEADER = struct.Struct("<BBiiiiii")  # mode, flags, seq, requests, tokens, sampled rows, pages, page size
_MODES = (ForwardMode.DECODE, ForwardMode.PREFILL)
IDS_ON_DEVICE = 1
"""Flag: this decode step's input ids are the previous step's greedy tokens, still on the device (the
overlap schedule); every rank takes them from its own copy of the previous step's logits."""


@dataclass(frozen=True)
class Forward:
    """A decoded forward step."""

    seq: int
    batch: ForwardBatch
    ids_on_device: bool


def encode_forward(batch: ForwardBatch, seq: int) -> bytes:
    ints = array("i", batch.input_ids)
    ints.extend(batch.positions)
    ints.extend(batch.out_cache_loc)
    ints.extend(batch.seq_lens)
    ints.extend(batch.extend_lens)
    ints.extend(batch.prefix_lens)
    ints.extend(len(p) for p in batch.req_pages)
    pages = 0
    for p in batch.req_pages:
        ints.extend(p)
        pages += len(p)
    ints.extend(batch.sample_rows)
    flags = IDS_ON_DEVICE if batch.input_ids_device is not None else 0
    header = _HEADER.pack(_MODES.index(batch.mode), flags, seq, batch.batch_size, batch.num_tokens,
                          len(batch.sample_rows), pages, batch.page_size)
    return FORWARD + header + ints.tobytes()


def decode_forward(message: bytes) -> Forward:
    mode, flags, seq, bs, tokens, samples, pages, page_size = _HEADER.unpack_from(message, 1)
    ints = array("i")
    ints.frombytes(memoryview(message)[1 + _HEADER.size:])
    cursor = 0

    def take(n: int) -> array:
        nonlocal cursor
        part = ints[cursor: cursor + n]
        cursor += n
        return part

    input_ids, positions, loc = take(tokens).tolist(), take(tokens).tolist(), take(tokens).tolist()
    seq_lens, extend_lens, prefix_lens = take(bs).tolist(), take(bs).tolist(), take(bs).tolist()
    req_pages = [take(n) for n in take(bs)]
    sample_rows = take(samples).tolist()
    assert cursor == len(ints) and sum(len(p) for p in req_pages) == pages, "malformed forward message"
    batch = ForwardBatch(
        mode=_MODES[mode], requests=[None] * bs, input_ids=input_ids, positions=positions, out_cache_loc=loc,
        seq_lens=seq_lens, extend_lens=extend_lens, prefix_lens=prefix_lens, req_pages=req_pages,
        page_size=page_size, sample_rows=sample_rows,
    )
    return Forward(seq, batch, bool(flags & IDS_ON_DEVICE))


def encode_control(name: str, *args: Any) -> bytes:
    return CONTROL + pickle.dumps((name, args), protocol=pickle.HIGHEST_PROTOCOL)


def decode_control(message: bytes) -> tuple[str, tuple[Any, ...]]:
    name, args = pickle.loads(memoryview(message)[1:])
    return name, args


def kind(message: bytes) -> Optional[bytes]:
    return message[:1] or None
