"""One host-to-device copy and one scatter kernel per replay, whatever the static buffers receive.

Why: between two decode graphs the stream runs only what the next graph needs to start, and each
op there costs its own launch gap. Uploading a step's ids and positions, its attention page lists
(three more copies) and its previous tokens separately, then zeroing the padded tails, takes six to ten
small ops, tens of microseconds in which the GPU idles, more than the rest of a small model's layer.
Here every new content is packed, as raw bytes, into one pinned buffer, copied in one transfer, and
scattered into the static buffers by one ``torch._foreach_copy_`` over byte views; contents already
on the device (the overlap schedule's token ids) join the same scatter.

On CUDA the transfer runs on a copy stream of its own, into one of ``RING`` device staging buffers:
under the overlap schedule the host sends step N+1 while step N's graph still runs, so the copy
lands during that graph, and the compute stream goes from N's last kernel straight to the scatter
(an already-met event wait) instead of through a host-to-device copy and its launch gaps. A staging
buffer is written again only after the scatter that read it (an event the copy stream waits on).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

RING = 2
"""Pinned buffers used in turn: the host packs step N+1 into one while step N's copy may be queued."""
ALIGN = 16
COPY_STREAM = True
"""On CUDA, transfer on a copy stream of the uploader's own (False: on the current stream, in line with
the scatter: what bench/ab_decode.py's h2d=compute variant measures against)."""


@dataclass(frozen=True, eq=False)
class Upload:
    """New contents for a view of a static buffer: ``src`` (host or device) has ``dst``'s shape and dtype."""

    dst: torch.Tensor
    src: torch.Tensor


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


class StepUploader:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._pinned: list[Optional[torch.Tensor]] = [None] * RING
        self._staging: list[Optional[torch.Tensor]] = [None] * RING
        self._copied: list[Optional[torch.cuda.Event]] = [None] * RING  # the turn's copy has run
        self._scattered: list[Optional[torch.cuda.Event]] = [None] * RING  # the turn's staging was read
        self._turn = 0
        self._copy_stream: Optional[torch.cuda.Stream] = None
        self._use_copy_stream = COPY_STREAM  # read once: an uploader keeps one way of sending

    def send(self, uploads: Sequence[Upload]) -> None:
        """Write every upload's ``src`` into its ``dst``, in stream order (nothing waits on the host
        except for the pinned buffer used two sends ago, whose copy has long run)."""
        for u in uploads:
            if u.src.shape != u.dst.shape or u.src.dtype != u.dst.dtype:
                raise ValueError(
                    f"upload of {tuple(u.src.shape)} {u.src.dtype} into {tuple(u.dst.shape)} {u.dst.dtype}"
                )
        host = [u for u in uploads if u.src.device.type == "cpu" and u.src.numel()]
        offsets, total = [], 0
        for u in host:
            offsets.append(total)
            total += -(-u.src.numel() * u.src.element_size() // ALIGN) * ALIGN
        turn = self._turn
        moved = self._transfer(host, offsets, total) if host else None
        at = {id(u): off for u, off in zip(host, offsets)}
        dsts, srcs, typed = [], [], []
        for u in uploads:
            if not u.src.numel():
                continue
            if id(u) in at:
                assert moved is not None
                src = moved[at[id(u)] : at[id(u)] + u.src.numel() * u.src.element_size()]
            else:
                src = _bytes(u.src.contiguous())
            if u.dst.is_contiguous():
                dsts.append(_bytes(u.dst))
                srcs.append(src)
            else:  # a strided view (e.g. a table's leading columns): its own typed copy
                typed.append((u.dst, src.view(u.dst.dtype).view(u.dst.shape)))
        if dsts:
            torch._foreach_copy_(dsts, srcs)
        for dst, src in typed:
            dst.copy_(src)
        if moved is not None and self._copy_stream is not None:  # only the copy stream waits for it
            if self._scattered[turn] is None:
                self._scattered[turn] = torch.cuda.Event()
            self._scattered[turn].record()  # a wait queued on its last record keeps that record

    def _transfer(self, host: list[Upload], offsets: list[int], total: int) -> torch.Tensor:
        """Pack the host sources into this turn's pinned buffer and start its one copy to the device
        (on CUDA: on the copy stream, which the current stream then waits for)."""
        cuda = self.device.type == "cuda"
        turn = self._turn
        self._turn = (turn + 1) % RING
        if self._copied[turn] is not None:
            self._copied[turn].synchronize()  # the host may rewrite the pinned buffer of two sends ago
        pinned = self._pinned[turn]
        if pinned is None or pinned.numel() < total:
            pinned = self._pinned[turn] = torch.empty(max(total, 4096), dtype=torch.uint8, pin_memory=cuda)
        for u, off in zip(host, offsets):
            b = _bytes(u.src.contiguous())
            pinned[off : off + b.numel()].copy_(b)
        if not cuda:
            staging = self._staging[turn]
            if staging is None or staging.numel() < total:
                staging = self._staging[turn] = torch.empty(max(total, 4096) * 2, dtype=torch.uint8)
            staging = staging[:total]
            staging.copy_(pinned[:total])
            return staging
        compute = torch.cuda.current_stream(self.device)
        if self._use_copy_stream and self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(self.device)
        stream = self._copy_stream if self._use_copy_stream else compute
        with torch.cuda.stream(stream):
            staging = self._staging[turn]
            if staging is None or staging.numel() < total:
                # allocated on the stream that writes it and, if that is the copy stream, marked as used
                # by the compute stream (its scatters): when it is replaced, the caching allocator reuses
                # it only after both streams' work
                staging = self._staging[turn] = torch.empty(max(total, 4096) * 2, dtype=torch.uint8, device=self.device)
                if stream is not compute:
                    staging.record_stream(compute)
            staging = staging[:total]
            if stream is not compute and self._scattered[turn] is not None:
                stream.wait_event(self._scattered[turn])  # the scatter of two sends ago read this staging
            staging.copy_(pinned[:total], non_blocking=True)
            if self._copied[turn] is None:
                self._copied[turn] = torch.cuda.Event()
            event = self._copied[turn]
            event.record(stream)
        if stream is not compute:
            compute.wait_event(event)
        return staging
