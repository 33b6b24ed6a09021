"""A rank's shard of the decoder: built on the meta device, filled from safetensors slices.

No rank reads a sharded tensor whole: ``ShardLoader.copy`` reads exactly this rank's rows (or columns)
through safetensors' ``get_slice``, so a rank's host traffic and device memory are its share of the
model plus the replicated norms. Which slice each HF parameter name gets is decided in ``cut_for``,
from ``layout``'s head / feature / vocabulary split.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..checkpoint.files import SafetensorsReader
from ..decoder import DecoderForCausalLM
from ..family import Stored
from ..layers.mlp import GatedMLP
from ..layers.moe import SparseMoE
from ..registry import model_class
from ..spec import ModelSpec
from .layers import ParallelLMHead, RowParallelLinear, VocabParallelEmbedding
from .layout import TensorParallel, kv_head_start, shard_spec, vocab_rows


def build_sharded(spec: ModelSpec, tp: TensorParallel) -> DecoderForCausalLM:
    """This rank's decoder (parameters on the current default device, usually meta): o and every dense
    down projection row-parallel, a sparse block's output all-reduced (its experts' down projections are
    row shards too, summed once after the routing weights)."""
    assert tp.comm is not None, "a sharded decoder needs the group's collectives"
    local = shard_spec(spec, tp.size)
    model = model_class(spec)(local)
    for layer in model.model.layers:
        layer.self_attn.o_proj = RowParallelLinear(
            local.num_heads * spec.head_dim, spec.hidden_size, spec.o_bias, tp.comm
        )
        for block in layer.modules():
            if isinstance(block, GatedMLP):
                block.down_proj = RowParallelLinear(local.intermediate_size, spec.hidden_size, spec.mlp_bias, tp.comm)
            elif isinstance(block, SparseMoE):
                block.reduce = tp.comm.all_reduce
    model.model.embed_tokens = VocabParallelEmbedding(spec.vocab_size, spec.hidden_size, tp.comm)
    model.lm_head = ParallelLMHead(spec.vocab_size, spec.hidden_size, tp.comm)
    model.tie_weights()
    return model


@dataclass(frozen=True)
class Cut:
    """The part of a checkpoint tensor one rank holds: ``[start, stop)`` along ``dim``; ``rank0_only``:
    the whole tensor on rank 0 and zeros elsewhere (a row-parallel bias, summed once by the all-reduce)."""

    dim: int = 0
    start: int = 0
    stop: int = 0
    rank0_only: bool = False


def cut_for(name: str, spec: ModelSpec, tp: TensorParallel) -> Optional[Cut]:
    """How rank ``tp.rank`` slices the checkpoint tensor ``name``; None: replicated whole."""
    if tp.size == 1:
        return None
    d, r = spec.head_dim, tp.rank
    heads = spec.num_heads // tp.size
    ffn = spec.intermediate_size // tp.size
    kv = max(1, spec.num_kv_heads // tp.size)
    module, _, kind = name.rpartition(".")
    proj = module.rpartition(".")[2]
    if ".experts." in name:  # every expert's features split like a dense MLP's, each of moe_intermediate_size
        width = spec.moe_intermediate_size // tp.size
        names = model_class(spec).layer_cls.expert_names
        return Cut(0, r * width, (r + 1) * width) if proj in names.column() else Cut(1, r * width, (r + 1) * width)
    if proj in ("embed_tokens", "lm_head"):
        rows = vocab_rows(spec.vocab_size, tp.size)
        return Cut(0, min(r * rows, spec.vocab_size), min((r + 1) * rows, spec.vocab_size))
    if proj == "q_proj":
        return Cut(0, r * heads * d, (r + 1) * heads * d)
    if proj in ("k_proj", "v_proj"):
        first = kv_head_start(spec, tp)
        return Cut(0, first * d, (first + kv) * d)
    if proj in ("gate_proj", "up_proj"):
        return Cut(0, r * ffn, (r + 1) * ffn)
    if proj in ("o_proj", "down_proj"):
        if kind == "bias":
            return Cut(rank0_only=True)
        width = heads * d if proj == "o_proj" else ffn
        return Cut(1, r * width, (r + 1) * width)
    return None


class ShardLoader:
    """What the checkpoint loader needs to fill a sharded decoder: the full shape each tensor must
    have in the file, and the copy of this rank's part of it into the parameter."""

    def __init__(self, spec: ModelSpec, tp: TensorParallel) -> None:
        self.spec = spec
        self.tp = tp
        with torch.device("meta"):
            self._full = {n: tuple(p.shape) for n, p in model_class(spec)(spec).named_parameters()}

    def full_shape(self, name: str) -> tuple[int, ...]:
        return self._full[name]

    @torch.no_grad()
    def copy(self, reader: SafetensorsReader, name: str, param: torch.Tensor, src: Optional[Stored] = None) -> None:
        """This rank's part of parameter ``name`` into ``param``; ``src``: where the checkpoint stores the whole
        parameter (rows of a stacked tensor, ``Family.stored``), under ``name`` itself by default."""
        src = src or Stored(name)
        cut = cut_for(name, self.spec, self.tp)
        if cut is None:
            param.copy_(_rows(reader, src))
        elif cut.rank0_only:
            param.copy_(_rows(reader, src)) if self.tp.rank == 0 else param.zero_()
        else:
            part = _rows(reader, src, cut)
            n = cut.stop - cut.start
            param.narrow(cut.dim, 0, n).copy_(part)
            if n < param.shape[cut.dim]:  # the vocabulary's tail on the last rank
                param.narrow(cut.dim, n, param.shape[cut.dim] - n).zero_()


def _rows(reader: SafetensorsReader, src: Stored, cut: Optional[Cut] = None) -> torch.Tensor:
    """The parameter stored at ``src`` (whole, or rows of a stacked tensor), or its ``cut`` only, reading
    just those rows or columns."""
    first, last = (0, reader.shape(src.name)[0]) if src.stop is None else (src.start, src.stop)
    if cut is None:
        return reader.tensor(src.name) if src.stop is None else reader.slice(src.name, 0, first, last)
    if cut.dim == 0:
        return reader.slice(src.name, 0, first + cut.start, first + cut.stop)
    if src.stop is None:
        return reader.slice(src.name, cut.dim, cut.start, cut.stop)
    return reader.slice(src.name, 0, first, last)[:, cut.start : cut.stop]
