"""The layers that talk across ranks: row-parallel projections, the vocab-parallel embedding and lm_head.

Column-parallel projections (q/k/v, gate/up) need no layer of their own: a rank's ``nn.Linear`` holds
its rows of the weight. A row-parallel projection (o, down) holds columns, so each rank computes a
partial sum of the output and an all-reduce adds them; its bias lives on rank 0 only (zeros elsewhere),
so the sum adds it once. All of them keep ``nn.Linear`` / ``nn.Embedding`` parameter names, so a rank's
weights load by HF name like the unsharded model's, and every collective is a plain call on fixed
shapes: capturable in a CUDA graph, re-run by an emulated one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import gemv as tg
from .layout import Communicator, vocab_rows


class RowParallelLinear(nn.Linear):
    """``out = all_reduce(x_shard @ W_shard.T [+ b on rank 0])``: o_proj and down_proj of a rank."""

    def __init__(self, in_features: int, out_features: int, bias: bool, comm: Communicator) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.comm = comm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.all_reduce(super().forward(x))

    def gemv_add(self, x: torch.Tensor, h: torch.Tensor, pdl: bool, silu_mul: bool = False) -> None:
        """``h += self(x)`` in place through the fused GEMV (the decoder's small-batch layers): rank 0
        adds its partial sum to ``h``, the other ranks overwrite ``h`` with theirs, and one in-place
        all-reduce of ``h`` leaves ``h + sum of partials`` on every rank (``h``, the residual stream,
        is the same on every rank before the call): the unsharded launches plus the all-reduce."""
        residual = h if self.comm.rank == 0 else None
        tg.gemv(x, self.weight, self.bias, silu_mul=silu_mul, residual=residual, out=h, pdl=pdl)
        self.comm.all_reduce(h)


class VocabParallelEmbedding(nn.Embedding):
    """Each rank holds ``ceil(vocab / size)`` consecutive rows; ids outside them give zeros, and the
    all-reduce sums in the one rank's row (adding zeros: bit-exact with the unsharded lookup)."""

    def __init__(self, vocab_size: int, hidden_size: int, comm: Communicator) -> None:
        rows = vocab_rows(vocab_size, comm.size)
        super().__init__(rows, hidden_size)
        self.comm = comm
        self.vocab_start = comm.rank * rows

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.num_embeddings)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out.masked_fill_(outside.unsqueeze(-1), 0)
        return self.comm.all_reduce(out)


class ParallelLMHead(nn.Linear):
    """Each rank scores its rows of the vocabulary; an all-gather gives every rank the full logits
    (identical bits on every rank, so a greedy token sampled from them is the same everywhere)."""

    def __init__(self, vocab_size: int, hidden_size: int, comm: Communicator) -> None:
        super().__init__(hidden_size, vocab_rows(vocab_size, comm.size), bias=False)
        self.comm = comm
        self.vocab_size = vocab_size

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        local = F.linear(hidden, self.weight)  # [T, rows]
        t, rows = local.shape
        stacked = self.comm.all_gather(local.contiguous())  # [size * T, rows]
        full = stacked.view(self.comm.size, t, rows).transpose(0, 1).reshape(t, self.comm.size * rows)
        return full[:, : self.vocab_size]
