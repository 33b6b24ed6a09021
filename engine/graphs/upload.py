"""One host-to-device copy and one scatter kernel per replay, whatever the static buffers receive.

Why: between two decode graphs the stream runs only what the next graph needs to start, and each
op there costs its own launch gap. A step used to upload its ids and positions, its attention page
lists (three more copies) and its previous tokens separately, then zero the padded tails: six to ten
small ops, tens of microseconds in which the GPU idles, more than the rest of a small model's layer.
Here every new content is packed, as raw bytes, into one pinned buffer, copied in one transfer, and
scattered into the static buffers by one ``torch._foreach_copy_`` over byte views; contents already
on the device (the overlap schedule's token ids) join the same scatter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

RING = 2
"""Pinned buffers used in turn: the host packs step N+1 into one while step N's copy may be queued."""
ALIGN = 16


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
        self._copied: list[Optional[torch.cuda.Event]] = [None] * RING
        self._turn = 0
        self._staging: Optional[torch.Tensor] = None

    def send(self, uploads: Sequence[Upload]) -> None:
        """Write every upload's ``src`` into its ``dst``, in stream order (nothing waits on the host
        except for the pinned buffer used two sends ago, whose copy has long run)."""
        for u in uploads:
            if u.src.shape != u.dst.shape or u.src.dtype != u.dst.dtype:
                raise ValueError(f"upload of {tuple(u.src.shape)} {u.src.dtype} into {tuple(u.dst.shape)} {u.dst.dtype}")
        host = [u for u in uploads if u.src.device.type == "cpu" and u.src.numel()]
        offsets, total = [], 0
        for u in host:
            offsets.append(total)
            total += -(-u.src.numel() * u.src.element_size() // ALIGN) * ALIGN
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

    def _transfer(self, host: list[Upload], offsets: list[int], total: int) -> torch.Tensor:
        """Pack the host sources into this turn's pinned buffer and start its one copy to the device."""
        cuda = self.device.type == "cuda"
        turn = self._turn
        self._turn = (turn + 1) % RING
        if self._copied[turn] is not None:
            self._copied[turn].synchronize()
        pinned = self._pinned[turn]
        if pinned is None or pinned.numel() < total:
            pinned = self._pinned[turn] = torch.empty(max(total, 4096), dtype=torch.uint8, pin_memory=cuda)
        for u, off in zip(host, offsets):
            b = _bytes(u.src.contiguous())
            pinned[off : off + b.numel()].copy_(b)
        if self._staging is None or self._staging.numel() < total:
            # the old buffer goes back to the caching allocator, which hands it out again only to work
            # queued after the scatters that still read it (same stream)
            self._staging = torch.empty(max(total, 4096) * 2, dtype=torch.uint8, device=self.device)
        staging = self._staging[:total]
        staging.copy_(pinned[:total], non_blocking=cuda)
        if cuda:
            event = self._copied[turn] = torch.cuda.Event()
            event.record()
        return staging
