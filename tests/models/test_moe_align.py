"""The grouped expert GEMM's index math (models/kernels/moe_align.py) on the CPU: the device-side
alignment of (token, slot) pairs by expert, and a block-by-block replay of what the kernel computes from
it, against the sorted torch path. The kernel itself runs in tests/cuda/test_cuda_moe.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from graphtop.models.kernels.fused_moe import tile_config
from graphtop.models.kernels.moe_align import align, padded_rows
from graphtop.models.layers.moe_routing import Routing, route
from graphtop.models.layers.moe_torch import sorted_experts

SHAPES = [(1, 8, 2, 16), (3, 4, 4, 16), (37, 8, 2, 16), (64, 16, 4, 64), (5, 64, 8, 16)]  # T, E, k, block


def routing(tokens: int, experts: int, k: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(tokens)])


@pytest.mark.parametrize("shape", SHAPES)
def test_pairs_sorted_by_expert_in_whole_blocks(shape):
    t, e, k, block = shape
    ids = routing(t, e, k)
    plan = align(ids, e, block)
    n = t * k
    rows = plan.sorted_ids.shape[0]
    assert rows == padded_rows(n, e, block) and rows % block == 0
    assert plan.expert_ids.shape == (rows // block,)
    total = int(plan.total)
    counts = torch.bincount(ids.reshape(-1), minlength=e)
    assert total == int(((counts + block - 1) // block * block).sum()) <= rows
    live = plan.sorted_ids[:total]
    assert sorted(live[live < n].tolist()) == list(range(n))  # every pair once
    assert bool((plan.sorted_ids[total:] == n).all())  # the rest is padding
    flat = ids.reshape(-1)
    blocks = live.view(-1, block)
    for b, members in enumerate(blocks):
        expert = int(plan.expert_ids[b])
        real = members[members < n].long()
        assert real.numel() > 0 and bool((flat[real] == expert).all())  # one expert a block, none empty
        assert real.tolist() == sorted(real.tolist())  # stable: pairs in token order
    assert plan.expert_ids[: total // block].tolist() == sorted(plan.expert_ids[: total // block].tolist())


def test_the_bound_holds_the_worst_routing():
    """Every pair to a different expert (decode at batch 1: k experts, one row each) pads the most."""
    ids = torch.arange(8)[None, :]
    plan = align(ids, 64, 16)
    assert int(plan.total) == 8 * 16 == plan.sorted_ids.shape[0]


def replay_kernel(x, w13, w2, weights, ids, act, block):
    """What the two grouped GEMM launches compute, one row block at a time, from the alignment alone:
    blocks at or past ``total`` skipped, padding rows masked, the routing weight applied in the second."""
    t, k = ids.shape
    n = t * k
    plan = align(ids, w13.shape[0], block)
    gate_up = torch.full((n, w13.shape[1]), float("nan"))
    out = torch.full((n, w2.shape[1]), float("nan"))
    flat_w = weights.reshape(-1)
    for b in range(int(plan.total) // block):
        pairs = plan.sorted_ids[b * block : (b + 1) * block].long()
        pairs = pairs[pairs < n]
        gate_up[pairs] = x[pairs // k] @ w13[int(plan.expert_ids[b])].T
    gate, up = gate_up.chunk(2, dim=-1)
    hidden = act(gate) * up
    for b in range(int(plan.total) // block):
        pairs = plan.sorted_ids[b * block : (b + 1) * block].long()
        pairs = pairs[pairs < n]
        out[pairs] = (hidden[pairs] @ w2[int(plan.expert_ids[b])].T) * flat_w[pairs, None]
    return out.view(t, k, -1).sum(1)


@pytest.mark.parametrize("tokens", [1, 7, 40])
def test_the_kernels_block_walk_computes_the_sorted_path(tokens):
    e, k, h, i = 8, 2, 32, 24
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, h, generator=gen)
    w13, w2 = torch.randn(e, 2 * i, h, generator=gen) / h**0.5, torch.randn(e, h, i, generator=gen) / i**0.5
    weights, ids = route(x @ torch.randn(e, h, generator=gen).T, Routing(k, True, True))
    block = tile_config(tokens * k, e).block_m
    got = replay_kernel(x, w13, w2, weights, ids, F.silu, block)
    want = sorted_experts(x, w13, w2, weights, ids, F.silu)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
