"""FlashInfer wrappers for models whose layers attend differently (sliding windows on some layers only),
the metadata a FlashInfer forward reads, and its K/V store.

A FlashInfer ``plan`` fixes the sliding window (``window_left``: the keys before the query it sees, so a
window of W keys is W - 1) and compiles its kernel for it, so one planned wrapper serves the layers of one
window. ``LayerGroups`` sorts the layers by window; a ``WrapperGroup`` holds a wrapper per window, plans
them all over the same page lists (FlashInfer computes each row's window start from its length, in the
kernel: a graph's replay masks the live batch's windows) and runs each layer on its own. A model without
windows has one group, planned as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from graphtop.models.kernels import fused as tk

from .base import AttentionShape


class LayerGroups:
    """The distinct windows of a model's layers (as FlashInfer's ``window_left``, -1: the whole context) and
    each layer's; ``windows`` per layer for the Triton decode kernel (0: the whole context)."""

    def __init__(self, shape: AttentionShape) -> None:
        lefts = [-1 if w is None else w - 1 for w in shape.windows]
        self.window_lefts: tuple[int, ...] = tuple(sorted(set(lefts))) or (-1,)
        self._group_of = tuple(self.window_lefts.index(left) for left in lefts)
        self.windows: tuple[int, ...] = tuple(w or 0 for w in shape.windows)

    def group(self, layer: int) -> int:
        return self._group_of[layer] if layer < len(self._group_of) else 0

    def window(self, layer: int) -> int:
        return self.windows[layer] if layer < len(self.windows) else 0


class WrapperGroup:
    """One FlashInfer wrapper per window of ``groups`` (``make()`` builds one), planned together: ``plan``
    takes the wrapper's own arguments and adds each one's ``window_left``; ``run`` runs ``layer``'s."""

    def __init__(self, make: Callable[[], Any], groups: LayerGroups) -> None:
        self.wrappers = tuple(make() for _ in groups.window_lefts)
        self.groups = groups

    def plan(self, *args: Any, **kw: Any) -> None:
        for wrapper, left in zip(self.wrappers, self.groups.window_lefts):
            wrapper.plan(*args, window_left=left, **kw)

    def run(self, q: Any, kv: Any, layer: int, **kw: Any) -> Any:
        return self.wrappers[self.groups.group(layer)].run(q, kv, **kw)


def store_kv(k: torch.Tensor, v: torch.Tensor, kf: torch.Tensor, vf: torch.Tensor, loc: torch.Tensor) -> None:
    """K and V into the pool in one Triton launch when possible (two index_copy_ otherwise)."""
    if tk.HAVE_TRITON and k.dtype == kf.dtype and kf.is_contiguous():
        tk.store_kv(k, v, kf, vf, loc)
    else:
        kf.index_copy_(0, loc, k.to(kf.dtype))
        vf.index_copy_(0, loc, v.to(vf.dtype))


@dataclass
class FlashInferMeta:
    out_cache_loc: torch.Tensor  # int64 flat slot per row: [rows] (decode, graph: the static view)
    wrapper: Any  # the planned WrapperGroup (or Triton decode wrapper) whose run() this forward calls
    decode: bool
    num_tokens: int = 0  # extend: real rows (q may carry padded rows past them)
