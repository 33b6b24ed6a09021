"""The engine's side of the Triton decode attention kernel (models/kernels/decode_attention.py): the
page lists it reads live in fixed device buffers a graph can capture, filled between steps."""

from __future__ import annotations

from array import array
from typing import Any, Optional

import torch

from graphtop.models.kernels.decode_attention import PagedDecode
from graphtop.models.kernels.qkv_input import QKVInput

from ..graphs.upload import Upload


class TritonDecodeWrapper:
    """``WrapperGroup``-shaped front of the Triton decode kernel: ``load`` replaces ``plan`` (it only copies
    the page lists into the device buffers: nothing to plan on the host), ``run`` attends for a layer, within
    its sliding window (``windows``, per layer, 0: the whole context; the kernel starts each row's window
    from the row's length, which it reads from the page lists)."""

    def __init__(
        self,
        kernel: PagedDecode,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        last: torch.Tensor,
        splits: Optional[int] = None,
        windows: tuple[int, ...] = (),
    ) -> None:
        self.kernel, self.indptr, self.indices, self.last, self.splits = kernel, indptr, indices, last, splits
        self.windows = windows

    def _window(self, layer: int) -> int:
        return self.windows[layer] if layer < len(self.windows) else 0

    def load(self, indptr: Any, indices: Any, last: Any, stage: torch.Tensor) -> None:
        """Copy the page lists in through ``stage``, a pinned buffer the caller keeps (and guards:
        the previous load's copies must have run before it is overwritten). A persistent buffer, not
        a fresh pinned tensor per call: the caching host allocator queries CUDA events when it
        recycles blocks, which a graph capture elsewhere in the process would not tolerate."""
        n = len(indices)
        a, b = len(indptr), len(indptr) + len(last)
        view = stage[: b + n]
        view.numpy()[:] = array("i", list(indptr) + list(last)) + array("i", indices)
        self.indptr[:a].copy_(view[:a], non_blocking=True)
        self.last[: b - a].copy_(view[a:b], non_blocking=True)
        self.indices[:n].copy_(view[b:], non_blocking=True)

    def uploads(self, indptr: torch.Tensor, indices: torch.Tensor, last: torch.Tensor) -> list[Upload]:
        """The page lists (host int32 tensors) as uploads into the device buffers: ``load``'s copies,
        for a caller that sends all of a step's contents at once (graphs/upload.py)."""
        return [
            Upload(self.indptr[: len(indptr)], indptr),
            Upload(self.last[: len(last)], last),
            Upload(self.indices[: len(indices)], indices),
        ]

    def run(self, q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], layer: int = 0) -> torch.Tensor:
        return self.kernel.run(
            q, kv[0], kv[1], self.indptr, self.indices, self.last, splits=self.splits, window=self._window(layer)
        )

    def run_qkv(self, x: QKVInput, kv: tuple[torch.Tensor, torch.Tensor], layer: int = 0) -> torch.Tensor:
        return self.kernel.run_qkv(
            x,
            kv[0],
            kv[1],
            self.indptr,
            self.indices,
            self.last,
            splits=self.splits,
            window=self._window(layer),
        )
