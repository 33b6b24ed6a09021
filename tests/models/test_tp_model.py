"""Tensor-parallel shards of the decoder, without processes: two (or four) ranks as threads.

``ThreadComm`` sums / gathers in rank order, so every rank sees the same bits, like NCCL and gloo.
These tests prove the sharding itself — slices per HF name, row-parallel all-reduce, vocab-parallel
embedding and lm_head, KV-head replication, biases summed once — against the unsharded decoder; the
process machinery is tests/engine/test_tp_engine.py's.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any, Callable

import pytest
import torch

from graphtop.models import CheckpointError, load_checkpoint
from graphtop.models.checkpoint.files import SafetensorsReader
from graphtop.models.layers.reference_attention import ContiguousAttention
from graphtop.models.parallel import TensorParallel, shard_spec, tp_problem


class ThreadComm:
    """Collectives between threads of one process (one per rank)."""

    def __init__(self, rank: int, size: int, shared: dict[str, Any]) -> None:
        self.rank, self.size, self.shared = rank, size, shared

    def _exchange(self, x: torch.Tensor) -> list[torch.Tensor]:
        slots, barrier = self.shared["slots"], self.shared["barrier"]
        slots[self.rank] = x.clone()
        barrier.wait()
        got = list(slots)
        barrier.wait()  # nobody overwrites a slot before everyone read it
        return got

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        parts = self._exchange(x)
        total = parts[0].clone()
        for p in parts[1:]:
            total += p
        return x.copy_(total)

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat(self._exchange(x))


def run_ranks(size: int, fn: Callable[[TensorParallel], Any]) -> list[Any]:
    """``fn(tp)`` on ``size`` threads at once; their results in rank order."""
    shared = {"slots": [None] * size, "barrier": threading.Barrier(size, timeout=60)}
    results: list[Any] = [None] * size
    errors: list[BaseException] = []

    def target(rank: int) -> None:
        try:
            results[rank] = fn(TensorParallel(rank, size, ThreadComm(rank, size, shared)))
        except BaseException as e:  # noqa: BLE001 - surfaced below
            errors.append(e)
            shared["barrier"].abort()

    threads = [threading.Thread(target=target, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        hidden = model(torch.tensor(ids), torch.arange(len(ids)), ContiguousAttention())
        return model.compute_logits(hidden)


CASES = {
    "llama": ("llama", {}, 2),
    "llama-biases-tied": ("llama", {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True}, 2),
    "mistral": ("mistral", {}, 2),
    "qwen2": ("qwen2", {}, 2),
    "qwen3": ("qwen3", {}, 2),
    "llama-kv-replicated": ("llama", {"num_kv_heads": 1}, 2),  # 1 KV head on both ranks
    "qwen3-tp4-odd-vocab": ("qwen3", {"vocab_size": 515}, 4),  # KV heads replicated, padded vocab
    # q/k/v and gate/up stored stacked: each rank reads its heads' rows of qkv_proj, its features' of gate_up_proj
    "phi3": ("phi3", {}, 2),
    "phi3-partial-rotary-tp4": ("phi3", {"partial_rotary_factor": 0.5}, 4),
    # every expert's features split across the ranks, the sparse block's partial sums all-reduced once
    "qwen3-moe": ("qwen3_moe", {}, 2),
    "qwen3-moe-dense-layer-tp4": ("qwen3_moe", {"mlp_only_layers": [0]}, 4),
    "mixtral": ("mixtral", {}, 2),
}


@pytest.mark.parametrize("case", CASES)
def test_shards_compute_the_unsharded_logits(tiny_ckpt, case, torch_one_thread):
    family, overrides, size = CASES[case]
    path = tiny_ckpt(family, **overrides)
    full = load_checkpoint(path)
    ids = [3, 17, 200, 45, 9, 311, 77, 5]
    want = logits(full.model, ids)
    got = run_ranks(size, lambda tp: logits(load_checkpoint(path, tp=tp).model, ids))
    for rank_logits in got:
        assert rank_logits.shape == want.shape
        torch.testing.assert_close(rank_logits, want, rtol=1e-5, atol=1e-5)
    assert all(torch.equal(g, got[0]) for g in got)  # gathered logits: the same bits on every rank


QKV_BIAS = ("q_proj.bias", "k_proj.bias", "v_proj.bias")


def test_a_rank_reads_only_its_slices(tiny_ckpt, monkeypatch):
    """No rank loads the whole model: sharded tensors are read through slices of 1/size of their
    rows or columns, whole tensors only for replicated norms and rank 0's row-parallel biases."""
    path = tiny_ckpt("llama", attention_bias=True)
    full = load_checkpoint(path)
    whole: dict[int, list[str]] = {0: [], 1: []}
    sliced: dict[int, int] = {0: 0, 1: 0}
    real_tensor, real_slice = SafetensorsReader.tensor, SafetensorsReader.slice
    rank_of = threading.local()

    def tensor(self, name):
        whole[rank_of.rank].append(name)
        return real_tensor(self, name)

    def slice_(self, name, dim, start, stop):
        part = real_slice(self, name, dim, start, stop)
        sliced[rank_of.rank] += part.numel()
        return part

    monkeypatch.setattr(SafetensorsReader, "tensor", tensor)
    monkeypatch.setattr(SafetensorsReader, "slice", slice_)

    def load(tp: TensorParallel):
        rank_of.rank = tp.rank
        return load_checkpoint(path, tp=tp)

    shards = run_ranks(2, load)
    full_params = dict(full.model.named_parameters())
    for rank, shard in enumerate(shards):
        assert all(("norm" in n) or (n.endswith("o_proj.bias") and rank == 0) for n in whole[rank]), whole[rank]
        split = sum(p.numel() for n, p in full_params.items() if p.dim() == 2 or n.endswith(QKV_BIAS))
        assert sliced[rank] == split // 2  # exactly half of every split tensor, nothing more
        assert shard.weights_bytes < 0.6 * full.weights_bytes
    # the two shards put together are the full weights
    for name, p in full_params.items():
        a, b = (dict(s.model.named_parameters())[name] for s in shards)
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            torch.testing.assert_close(torch.cat([a, b], dim=1), p, rtol=0, atol=0)
        elif name.endswith("o_proj.bias"):
            assert torch.equal(a, p) and not b.any()
        elif p.dim() == 2 or name.endswith(QKV_BIAS):
            torch.testing.assert_close(torch.cat([a, b]), p, rtol=0, atol=0)
        else:
            assert torch.equal(a, p) and torch.equal(b, p)


def test_rank_spec_and_refusals(tiny_ckpt):
    full = load_checkpoint(tiny_ckpt("llama")).spec  # 4 heads, 2 KV heads, 128 MLP features
    local = shard_spec(full, 2)
    assert (local.num_heads, local.num_kv_heads, local.intermediate_size, local.vocab_size) == (
        2,
        1,
        64,
        full.vocab_size,
    )
    assert tp_problem(full, 4) is None  # 1 head per rank, each KV head on two ranks
    assert "num_attention_heads=4" in tp_problem(full, 3)
    assert "num_key_value_heads=4" in tp_problem(replace(full, num_heads=12, num_kv_heads=4), 6)
    assert "intermediate_size=128" in tp_problem(replace(full, num_heads=12, num_kv_heads=3), 3)
    with pytest.raises(CheckpointError, match=r"--tp 8 does not divide num_attention_heads=4 in "):
        run_ranks(1, lambda tp: load_checkpoint(tiny_ckpt("llama"), tp=TensorParallel(0, 8, tp.comm)))
    gemma = load_checkpoint(tiny_ckpt("gemma2")).spec  # the sandwich block: models/parallel/ does not shard it
    assert tp_problem(gemma, 1) is None
    assert tp_problem(gemma, 2) == "--tp 2: tensor parallelism is not implemented for Gemma2ForCausalLM"


def test_a_saved_random_checkpoint_loads_whole_and_sharded(tmp_path, torch_one_thread):
    """The GPU tests and bench/tp_bench.py save a published shape with random weights to disk so that
    ranks can load their slices; here a small variant of it round-trips."""
    from graphtop.models.synthetic.random_model import save_random_checkpoint

    small = dict(
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=301,
    )  # the shape's own ids lie outside it
    path = save_random_checkpoint("llama-3.1-8b", tmp_path / "rand", dtype=torch.float32, **small)
    assert save_random_checkpoint("llama-3.1-8b", path, dtype=torch.float32, **small) == path  # reused
    full = load_checkpoint(path)
    assert full.spec.vocab_size == 301 and full.spec.rope_type == "llama3"
    ids = [5, 17, 200, 45]
    want = logits(full.model, ids)
    for got in run_ranks(2, lambda tp: logits(load_checkpoint(path, tp=tp).model, ids)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_rank_holds_every_expert_with_its_share_of_features(tiny_ckpt, torch_one_thread):
    """Gate and up rows, down columns of each expert: the ranks' parts put together are the full experts,
    and each rank's expert bytes (what its memory ledger shows) are its share."""
    from graphtop.models.layers.moe import expert_weight_bytes

    path = tiny_ckpt("mixtral")
    full = load_checkpoint(path)
    shards = run_ranks(2, lambda tp: load_checkpoint(path, tp=tp))
    experts = {n: p for n, p in full.model.named_parameters() if ".experts." in n}
    assert len(experts) == 2 * 4 * 3  # layers x experts x (w1, w3, w2)
    for name, p in experts.items():
        a, b = (dict(s.model.named_parameters())[name] for s in shards)
        torch.testing.assert_close(torch.cat([a, b], dim=1 if name.endswith("w2.weight") else 0), p, rtol=0, atol=0)
    assert all(2 * expert_weight_bytes(s.model) == expert_weight_bytes(full.model) > 0 for s in shards)
