"""Static buffers: allocated once at max size, so every graph sees the same addresses forever.

Each slot declares how its padded tail is treated. Per step only contents are copied in: live rows
and padded tails alike, with whatever else the step's replay needs, in one host→device copy and one
scatter (graphs/upload.py).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch

from .upload import StepUploader, Upload


class PaddingPolicy(enum.Enum):
    KEEP_PAD = "keep_pad"  # tail keeps stale contents: harmless because masked or never read
    FILL_SENTINEL = "fill_sentinel"  # tail set to pad_value every step (e.g. dummy KV slot, seq len 1)
    ZERO = "zero"  # tail zeroed every step
    FOREACH_COPY = "foreach_copy"  # the source already covers the padded length; copied whole
    FILL_ONCE = "fill_once"  # filled with pad_value at allocation, never written per step


SourceFn = Callable[[Any, int], Any]  # (batch, padded_size) -> list | tensor (host)


@dataclass(frozen=True)
class BufferSlot:
    name: str
    shape: Callable[[int], tuple[int, ...]]  # max size -> full buffer shape
    dtype: torch.dtype
    policy: PaddingPolicy
    pad_value: float | int = 0
    source: Optional[SourceFn] = None
    axis: int = 0


@dataclass
class BridgeBuffers:
    """Static inputs/outputs of breakable-graph break functions (graphs/breakable.py): [max_tokens, ...]
    each, shared by every bucket."""

    inputs: list[torch.Tensor]
    output: torch.Tensor


class StaticBufferError(RuntimeError):
    """The static-buffer contract was broken (an address moved, or data does not fit)."""


class BufferRegistry:
    def __init__(self, device: torch.device, max_size: int):
        self.device = device
        self.max_size = max_size
        self.slots: dict[str, BufferSlot] = {}
        self.buffers: dict[str, torch.Tensor] = {}
        self.uploader = StepUploader(device)

    def declare(self, slot: BufferSlot) -> torch.Tensor:
        if slot.name in self.slots:
            raise ValueError(f"static buffer {slot.name!r} declared twice")
        buf = torch.zeros(slot.shape(self.max_size), dtype=slot.dtype, device=self.device)
        if slot.policy in (PaddingPolicy.FILL_ONCE, PaddingPolicy.FILL_SENTINEL) and slot.pad_value:
            buf.fill_(slot.pad_value)
        self.slots[slot.name] = slot
        self.buffers[slot.name] = buf
        return buf

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.buffers[name]

    def view(self, name: str, size: int) -> torch.Tensor:
        slot = self.slots[name]
        return self.buffers[name].narrow(slot.axis, 0, size)

    def reset(self) -> None:
        """Every slot back to its pad value, so a capture run can only touch harmless KV slots."""
        for name, slot in self.slots.items():
            self.buffers[name].fill_(slot.pad_value)

    def addresses(self) -> dict[str, int]:
        return {name: buf.data_ptr() for name, buf in self.buffers.items()}

    def fill(
        self,
        batch: Any,
        padded: int,
        names: Optional[Sequence[str]] = None,
        extra: Sequence[Upload] = (),
        device_sources: Optional[dict[str, torch.Tensor]] = None,
    ) -> None:
        """Copy each sourced slot's live data in and apply its tail policy up to ``padded`` rows, plus
        ``extra`` uploads (e.g. an attention backend's page lists), all in one transfer
        (graphs/upload.py). ``device_sources``: slots whose live rows come from a device tensor
        instead of their host source (the overlap schedule's token ids)."""
        uploads = list(extra)
        device_sources = device_sources or {}
        for name in names if names is not None else self.slots:
            slot = self.slots[name]
            if slot.source is None or slot.policy is PaddingPolicy.FILL_ONCE:
                continue
            data = device_sources[name] if name in device_sources else slot.source(batch, padded)
            src = data if isinstance(data, torch.Tensor) else torch.tensor(data, dtype=slot.dtype)
            buf = self.buffers[name]
            if src.dim() != buf.dim() or any(s > b for s, b in zip(src.shape, buf.shape)):
                raise StaticBufferError(
                    f"{name}: data of shape {tuple(src.shape)} does not fit static buffer {tuple(buf.shape)}"
                )
            if src.dtype != slot.dtype:
                src = src.to(slot.dtype)
            uploads.append(Upload(buf[tuple(slice(0, s) for s in src.shape)], src))
            raw = src.shape[slot.axis]
            if raw < padded and slot.policy in (PaddingPolicy.ZERO, PaddingPolicy.FILL_SENTINEL):
                tail = buf.narrow(slot.axis, raw, padded - raw)
                value = 0 if slot.policy is PaddingPolicy.ZERO else slot.pad_value
                uploads.append(Upload(tail, torch.full(tail.shape, value, dtype=slot.dtype)))
        self.uploader.send(uploads)
