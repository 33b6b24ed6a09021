"""The KV pool plan: the pool, its reserved dummy page included, stays inside the budget it was given."""

from __future__ import annotations

import pytest
import torch

from graphtop.engine.config import EngineConfig
from graphtop.engine.memory_plan import MemoryPlanError, MiB, plan_kv_pool

CPU = torch.device("cpu")


def plan(budget_bytes: int, *, bytes_per_token: int = 1024, page_size: int = 1, max_total_tokens: int | None = None):
    return plan_kv_pool(
        device=CPU,
        weights_bytes=0,
        bytes_per_token=bytes_per_token,
        page_size=page_size,
        mem_fraction_static=0.9,
        cpu_kv_budget_bytes=budget_bytes,
        activation_reserve_bytes=0,
        graph_reserve_bytes=0,
        max_total_tokens=max_total_tokens,
    )


@pytest.mark.parametrize(
    "budget_bytes,bytes_per_token,page_size",
    [
        (1 * MiB, 1024, 1),
        (1 * MiB, 1024, 16),
        (1 * MiB + 1000, 1000, 7),
        (3 * MiB, 4096, 64),
        (64 * 1024, 1024, 32),
    ],
)
def test_the_pool_with_its_dummy_page_fits_the_budget(budget_bytes, bytes_per_token, page_size):
    """The dummy page came on top of --kv-budget-mb: 1 MiB of 1 KiB tokens planned 1,025 pages."""
    p = plan(budget_bytes, bytes_per_token=bytes_per_token, page_size=page_size)
    page_bytes = page_size * bytes_per_token
    assert p.kv_pool_bytes == p.num_pages * page_bytes <= budget_bytes
    assert budget_bytes - p.kv_pool_bytes < page_bytes  # and no whole page of the budget is left unused
    assert p.capacity_tokens == (p.num_pages - 1) * page_size


@pytest.mark.parametrize("cap,page_size,capacity", [(100, 1, 100), (100, 16, 96), (16, 16, 16), (2, 1, 2)])
def test_max_total_tokens_caps_the_usable_tokens(cap, page_size, capacity):
    p = plan(64 * MiB, page_size=page_size, max_total_tokens=cap)
    assert p.capacity_tokens == capacity and p.num_pages == capacity // page_size + 1


def test_a_budget_of_one_page_is_no_room():
    """One page would be the dummy page alone: no request could ever be admitted."""
    with pytest.raises(MemoryPlanError, match="less than two pages of 16 .one is the reserved dummy page"):
        plan(16 * 1024, page_size=16)


def test_one_total_token_is_refused_at_config_time():
    """A pool of one token built an engine that rejected every prompt (each needs one more to generate)."""
    with pytest.raises(
        ValueError, match=r"max total tokens must be >= 2 \(a prompt token and one to generate\), got 1"
    ):
        EngineConfig(device="cpu", max_total_tokens=1).validate()


def test_graph_buffers_estimate_counts_the_experts_activations():
    """A mixture of experts' widest activation is each of a token's k experts' rows (gate|up, SiLU·mul,
    output), not the dense MLP's: Qwen3-30B-A3B's shape needs 8 * (3 * 768 + 2048) per token, not 2 * 6144."""
    from dataclasses import replace

    from graphtop.engine.memory_plan import graph_buffers_estimate
    from graphtop.models.spec import ModelSpec

    dense = ModelSpec(
        "Qwen3ForCausalLM", 151936, 2048, 6144, 48, 32, 4, 128, 1e-6, 1e6, None, 40960, False, False, True, (), None
    )
    moe = replace(dense, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, moe_layers=tuple(range(48)))
    attention = (2 * 32 + 2 * 4) * 128 + 2048
    assert graph_buffers_estimate(dense, torch.bfloat16, 0, 0, 1) == (attention + 2 * 6144) * 2
    assert graph_buffers_estimate(moe, torch.bfloat16, 0, 0, 1) == (attention + 8 * (3 * 768 + 2048)) * 2
