"""The attention-backend contract (mini-sglang style: one ABC, a backend per kernel library).

The split that makes graphs possible (attention metadata built out of the graph, read in it):
- ``prepare`` / ``prepare_replay`` run on the host, outside any graph: they may sync, allocate and
  call host-side planners (FlashInfer ``plan``);
- ``prepare_in_graph`` holds only device ops over fixed-address buffers, so a graph may capture it;
- ``forward`` writes the step's K/V into the pool and computes attention from ``self.meta``, which
  during a graph points at static buffers and at replay holds the live batch's contents.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

import torch

from graphtop.models.kernels.qkv_input import QKVInput
from graphtop.models.spec import ModelSpec

from ..batch import ForwardBatch
from ..graphs.buffers import BufferSlot, PaddingPolicy
from ..kv_pool import DUMMY_PAGE, KVPool


class AttentionBackendError(RuntimeError):
    """An attention backend cannot serve this model, pool or device; the message is one line."""


@dataclass(frozen=True)
class AttentionShape:
    """What a backend attends with: heads, logit scale, and per layer the sliding window (keys a query sees,
    its own included; None: the whole context) and the logits' soft cap (cap * tanh(logit / cap))."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    windows: tuple[Optional[int], ...] = ()
    softcap: Optional[float] = None

    @classmethod
    def of(cls, spec: ModelSpec) -> "AttentionShape":
        """The shape of ``spec``'s model (a tensor-parallel rank's spec: its heads)."""
        return cls(
            spec.num_heads,
            spec.num_kv_heads,
            spec.head_dim,
            spec.softmax_scale,
            spec.layer_windows(),
            spec.attn_softcap,
        )

    def window(self, layer: int) -> Optional[int]:
        return self.windows[layer] if layer < len(self.windows) else None

    @property
    def distinct_windows(self) -> tuple[int, ...]:
        """The window sizes some layer attends within, ascending."""
        return tuple(sorted({w for w in self.windows if w is not None}))


class AttentionBackend(ABC):
    name: ClassVar[str] = "abstract"
    #: backends whose decode kernels can live inside a CUDA graph
    supports_decode_graph: ClassVar[bool] = True

    def __init__(self, pool: KVPool, shape: AttentionShape, device: torch.device):
        self.pool = pool
        self.shape = shape
        self.device = device
        self.meta: Any = None

    def clone(self) -> "AttentionBackend":
        """Another instance over the same pool with its own metadata and workspaces, for a forward on
        another thread (the parity check's eager re-run) that must not disturb this one's state."""
        return type(self)(self.pool, self.shape, self.device)

    def seq_len_fill_value(self) -> int:
        """Sequence length written for padded graph rows: 1, reading only the dummy page's slot."""
        return 1

    # --- eager path ----------------------------------------------------------------------------
    @abstractmethod
    def prepare(self, batch: ForwardBatch) -> None:
        """Host side: build ``self.meta`` for an eager forward of exactly this batch."""

    def prepare_in_graph(self) -> None:
        """Device-only derivations from ``self.meta`` (capturable). Called once per forward."""

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> torch.Tensor:
        """Store k/v at ``meta.out_cache_loc`` and return attention output shaped like q."""

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> torch.Tensor:
        """The backend is the model's ``attn``: calling it is ``forward``; ``forward_qkv`` is its
        optional fused entry (models/decoder.py ``AttentionFn``)."""
        return self.forward(q, k, v, layer_id)

    def forward_qkv(self, x: QKVInput, layer_id: int) -> Optional[torch.Tensor]:
        """Attention straight from the fused q|k|v projection [T, (H + 2 Hkv) * D] — q/k RMSNorm when
        weights are given, NeoX RoPE from ``x.cos_sin_cache``, the K/V store — returning o [T, H, D];
        or None, and the model does those steps itself and calls ``forward``. Backends with a kernel
        that fuses them override this (one launch per layer instead of several)."""
        return None

    # --- decode graphs -------------------------------------------------------------------------
    def init_graph_state(self, max_bs: int, max_pages_per_req: int) -> None:
        """Allocate the fixed-address metadata buffers every decode graph will read."""
        raise NotImplementedError(f"{self.name} does not support decode graphs")

    def graph_buffer_slots(self) -> list[Any]:
        """Static-buffer slots (engine.graphs.buffers.BufferSlot) this backend needs filled per step."""
        return []

    def graph_widths(self) -> list[int]:
        """Page-table widths (in pages) a decode bucket is captured at, widest first. ``[0]``: one graph
        per bucket, for kernels that walk only each row's own pages. A backend whose graph reads a
        fixed-width table gives several, and a step replays the narrowest that holds its longest row
        (``pick_graph_width``, engine/graphs/bucket_policy.py), so its cost follows the batch's context,
        not the widest one allowed."""
        return [0]

    def out_cache_loc_slot(self) -> BufferSlot:
        """The slot of the step's K/V destinations, one per row, which every backend's decode graph writes
        through: a padded row's points into the dummy page, where nothing reads it."""
        return BufferSlot(
            "out_cache_loc",
            lambda n: (n,),
            torch.int64,
            PaddingPolicy.FILL_SENTINEL,
            pad_value=DUMMY_PAGE * self.pool.page_size,
            source=lambda b, p: b.out_cache_loc,
        )

    def bind_graph_meta(self, registry: Any, bucket: int, width: int = 0) -> None:
        """Point ``self.meta`` at the static buffers' views for a graph of ``bucket`` rows that reads
        ``width`` page-table columns (0: all of them)."""
        raise NotImplementedError

    def prepare_replay(self, batch: ForwardBatch, bucket: int, uploads: Optional[list[Any]] = None) -> None:
        """Host side, before a decode replay: e.g. FlashInfer plan. Contents for the backend's own
        device buffers go into ``uploads`` (engine.graphs.upload.Upload) when the caller gives a list:
        it sends them with the static buffers' in one copy, before the replay; without a list the
        backend copies them itself."""

    def prepare_capture(self, bucket: int) -> None:
        """Host side, before capturing a decode graph of ``bucket`` rows (dummy metadata)."""

    def describe(self) -> str:
        return self.name
