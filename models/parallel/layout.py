"""Who holds what under tensor parallelism: the one place that splits heads, the MLP and the vocabulary.

A rank's decoder is its family's model built from ``shard_spec(spec, size)``: its attention sees
``num_heads / size`` query heads and its share of the KV heads, its MLP a slice of the intermediate
features, so q/k/v and gate/up are column shards and o/down row shards of the full weights without a line
of the decoder changing. A mixture of experts splits every expert's MLP features alike
(``moe_intermediate_size / size`` each): every rank holds all experts, a slice of each. The vocabulary
stays whole in the spec (the logits the engine samples are full width); the embedding and lm_head hold
``ceil(vocab / size)`` rows each.

KV heads: split when ``size`` divides them; when ``size`` is a multiple of them, each KV head is
replicated on ``size / num_kv_heads`` ranks (vLLM's rule), so every rank keeps one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Protocol

import torch

from ..registry import resolve
from ..spec import ModelSpec


class Communicator(Protocol):
    """The collectives a sharded model calls (the engine provides them over torch.distributed)."""

    rank: int
    size: int

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks, in place; returns ``x``."""

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """[size * x.shape[0], ...]: every rank's ``x`` stacked along dim 0, in rank order."""


@dataclass(frozen=True)
class TensorParallel:
    """This process's place in the tensor-parallel group, and the collectives between the ranks."""

    rank: int
    size: int
    comm: Optional[Communicator] = None


def tp_problem(spec: ModelSpec, size: int) -> Optional[str]:
    """Why ``spec`` cannot be split over ``size`` ranks (one line), or None."""
    if size < 1:
        return f"--tp must be >= 1, got {size}"
    if size > 1 and not resolve(spec.architecture).tensor_parallel:
        return f"--tp {size}: tensor parallelism is not implemented for {spec.architecture}"
    if spec.num_heads % size:
        return f"--tp {size} does not divide num_attention_heads={spec.num_heads}"
    kv = spec.num_kv_heads
    if kv % size and size % kv:
        return (
            f"--tp {size} and num_key_value_heads={kv}: one must divide the other "
            "(KV heads are split, or replicated when --tp is a multiple of them)"
        )
    if spec.intermediate_size % size and len(spec.moe_layers) < spec.num_layers:
        return f"--tp {size} does not divide intermediate_size={spec.intermediate_size}"
    if spec.moe_intermediate_size % size:
        return f"--tp {size} does not divide each expert's MLP width ({spec.moe_intermediate_size})"
    return None


def shard_spec(spec: ModelSpec, size: int) -> ModelSpec:
    """The spec a rank's decoder is built from (heads and MLP features per rank; vocab whole)."""
    if size == 1:
        return spec
    return replace(
        spec,
        num_heads=spec.num_heads // size,
        num_kv_heads=max(1, spec.num_kv_heads // size),
        intermediate_size=spec.intermediate_size // size,
        moe_intermediate_size=spec.moe_intermediate_size // size,
    )


def kv_head_start(spec: ModelSpec, tp: TensorParallel) -> int:
    """First (global) KV head this rank holds."""
    kv = spec.num_kv_heads
    if kv >= tp.size:
        return tp.rank * (kv // tp.size)
    return tp.rank // (tp.size // kv)


def vocab_rows(vocab_size: int, size: int) -> int:
    """Embedding / lm_head rows per rank (the last rank's tail past the vocabulary is zero)."""
    return -(-vocab_size // size)
