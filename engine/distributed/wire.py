"""What rank 0 sends its workers: one compact message per forward step, and rare control messages.

A forward step is the scheduler's decision (``ForwardBatch``) as plain int32 runs behind a fixed
header — ids, positions, KV slots, per-request lengths, sampled rows — so encoding is a few ``array``
extends and decoding one ``frombytes``; no per-request object is pickled. Page lists, the one part that
grows with the context, travel as changes: each request gets a slot on both sides, and a step sends
only the pages a request gained since the last step it was in (one page in every ``page_size`` decode
steps), or its whole list when the list was replaced (admission, preemption). Slots of requests whose
pages were released are dropped on both sides. This relies on the scheduler's one way of changing a
request's pages: append to its array, or replace the array.

Control messages (plan, setup, capture, recapture, stop) are rare and pickled.
"""

from __future__ import annotations

import itertools
import pickle
import struct
from array import array
from dataclasses import dataclass
from typing import Any

from ..batch import ForwardBatch, ForwardMode

FORWARD = b"F"
CONTROL = b"C"
# mode, flags, seq, requests, tokens, sampled rows, new pages, released slots, page size
_HEADER = struct.Struct("<BBiiiiiii")
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


@dataclass
class _Sent:
    slot: int
    pages: array  # the request's page array when it was last sent
    count: int  # how many of its pages the workers have


class ForwardEncoder:
    """Rank 0's side: remembers what page lists the workers hold."""

    def __init__(self) -> None:
        self._sent: dict[Any, _Sent] = {}  # Request -> what the workers have of its pages
        self._slots = itertools.count()

    def encode(self, batch: ForwardBatch, seq: int) -> bytearray:
        bs = batch.batch_size
        ints = array("i", batch.input_ids)
        ints.extend(batch.positions)
        ints.extend(batch.out_cache_loc)
        ints.extend(batch.seq_lens)
        ints.extend(batch.extend_lens)
        ints.extend(batch.prefix_lens)
        slots: list[int] = []
        keeps: list[int] = []
        added: list[int] = []
        new = array("i")
        sent_by_req = self._sent
        for req, pages in zip(batch.requests, batch.req_pages):
            sent = sent_by_req.get(req)
            n = len(pages)
            if sent is None:
                sent = sent_by_req[req] = _Sent(next(self._slots), pages, 0)
            elif sent.pages is not pages or sent.count > n:
                sent.pages, sent.count = pages, 0  # a new page list: send it whole
            k = sent.count
            slots.append(sent.slot)
            keeps.append(k)
            added.append(n - k)
            if n > k:
                new.extend(pages[k:] if k else pages)
            sent.count = n
        # A request whose array was replaced since it was sent (finished, cancelled or preempted) and
        # that is not in this step (those were just re-sent) frees its slot.
        released = [s.slot for r, s in sent_by_req.items() if r.pages is not s.pages]
        if released:
            self._sent = {r: s for r, s in sent_by_req.items() if r.pages is s.pages}
        logit_rows = batch.logit_rows  # the workers' lm_head gathers the same rows as rank 0's
        for part in (slots, keeps, added, new, logit_rows, released):
            ints.extend(part)
        flags = IDS_ON_DEVICE if batch.input_ids_device is not None else 0
        message = bytearray(FORWARD)
        message += _HEADER.pack(
            _MODES.index(batch.mode),
            flags,
            seq,
            bs,
            batch.num_tokens,
            len(logit_rows),
            len(new),
            len(released),
            batch.page_size,
        )
        message += memoryview(ints).cast("B")
        return message


class ForwardDecoder:
    """A worker's side: the page lists it holds, by slot."""

    def __init__(self) -> None:
        self.pages: dict[int, array] = {}

    def decode(self, message: bytes) -> Forward:
        mode, flags, seq, bs, tokens, samples, n_new, n_released, page_size = _HEADER.unpack_from(message, 1)
        ints = array("i")
        ints.frombytes(memoryview(message)[1 + _HEADER.size :])
        cursor = 0

        def take(n: int) -> array:
            nonlocal cursor
            part = ints[cursor : cursor + n]
            cursor += n
            return part

        input_ids, positions, loc = take(tokens).tolist(), take(tokens).tolist(), take(tokens).tolist()
        seq_lens, extend_lens, prefix_lens = take(bs).tolist(), take(bs).tolist(), take(bs).tolist()
        slots, keeps, added = take(bs), take(bs), take(bs)
        new = take(n_new)
        req_pages, start = [], 0
        for slot, keep, n in zip(slots, keeps, added):
            if keep:
                pages = self.pages[slot]  # what rank 0 sent before; it keeps ``keep`` of it
                del pages[keep:]
            else:
                pages = self.pages[slot] = array("i")
            pages.extend(new[start : start + n])
            start += n
            req_pages.append(pages)
        sample_rows = take(samples).tolist()
        for slot in take(n_released):
            self.pages.pop(slot, None)
        assert cursor == len(ints) and start == n_new, "malformed forward message"
        batch = ForwardBatch(
            mode=_MODES[mode],
            requests=[None] * bs,
            input_ids=input_ids,
            positions=positions,
            out_cache_loc=loc,
            seq_lens=seq_lens,
            extend_lens=extend_lens,
            prefix_lens=prefix_lens,
            req_pages=req_pages,
            page_size=page_size,
            sample_rows=sample_rows,
        )
        return Forward(seq, batch, bool(flags & IDS_ON_DEVICE))


def encode_control(name: str, *args: Any) -> bytes:
    return CONTROL + pickle.dumps((name, args), protocol=pickle.HIGHEST_PROTOCOL)


def decode_control(message: bytes) -> tuple[str, tuple[Any, ...]]:
    name, args = pickle.loads(memoryview(message)[1:])
    return name, args
