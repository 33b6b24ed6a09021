"""How many KV tokens fit: from free device memory on CUDA, from a budget on CPU.

The plan keeps every line (weights, reserves, pool) so the dashboard's memory ledger can show where
each byte went; graph capture later replaces the graph estimate with measured numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from graphtop.models.checkpoint.capacity import fit_problem

GiB = 1 << 30
MiB = 1 << 20


@dataclass
class MemoryPlan:
    device: str
    total_bytes: int
    weights_bytes: int
    activation_reserve_bytes: int
    graph_reserve_bytes: int
    kv_pool_bytes: int
    num_pages: int
    page_size: int
    bytes_per_token: int

    @property
    def capacity_tokens(self) -> int:
        return (self.num_pages - 1) * self.page_size


class MemoryPlanError(RuntimeError):
    pass


def plan_kv_pool(
    *,
    device: torch.device,
    weights_bytes: int,
    bytes_per_token: int,
    page_size: int,
    mem_fraction_static: float,
    cpu_kv_budget_bytes: int,
    activation_reserve_bytes: int,
    graph_reserve_bytes: int,
    max_total_tokens: int | None,
) -> MemoryPlan:
    """On CUDA: total × mem_fraction_static − weights − graph reserve, capped by what is free minus
    the activation reserve. On CPU: the configured budget (host memory is not ours to take). Either way
    the pool, its reserved dummy page included, stays within the budget."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        budget = int(total * mem_fraction_static) - weights_bytes - graph_reserve_bytes
        budget = min(budget, free - activation_reserve_bytes - graph_reserve_bytes)
    else:
        total = cpu_kv_budget_bytes
        budget = cpu_kv_budget_bytes
        activation_reserve_bytes = 0
        graph_reserve_bytes = 0
    num_pages = max(budget, 0) // (page_size * bytes_per_token)  # the dummy page comes out of the budget too
    if max_total_tokens is not None:
        num_pages = min(num_pages, max_total_tokens // page_size + 1)  # the cap counts usable tokens: +1 dummy
    tokens = (num_pages - 1) * page_size
    if num_pages < 2:
        raise MemoryPlanError(_no_room(device, budget, weights_bytes, bytes_per_token, page_size))
    if device.type != "cuda":  # on CUDA the budget came from free memory; a host budget is just a number
        problem = fit_problem(f"a KV pool of {tokens:,} tokens", num_pages * page_size * bytes_per_token, device)
        if problem:
            raise MemoryPlanError(f"{problem}; lower --kv-budget-mb or --max-total-tokens")
    return MemoryPlan(
        device=str(device),
        total_bytes=int(total),
        weights_bytes=weights_bytes,
        activation_reserve_bytes=activation_reserve_bytes,
        graph_reserve_bytes=graph_reserve_bytes,
        kv_pool_bytes=num_pages * page_size * bytes_per_token,
        num_pages=num_pages,
        page_size=page_size,
        bytes_per_token=bytes_per_token,
    )


def _no_room(device: torch.device, budget: int, weights_bytes: int, bytes_per_token: int, page_size: int) -> str:
    """Why not one page fits, naming the flag that sizes the pool on this device: on a CPU the budget is
    ``--kv-budget-mb`` alone (weights are not taken from it), and ``--mem-fraction-static`` does nothing."""
    if device.type == "cuda":
        return (
            f"no room for a KV pool on {device}: budget {budget / MiB:.1f} MiB after weights "
            f"({weights_bytes / MiB:.1f} MiB) and reserves; raise --mem-fraction-static or lower reserves"
        )
    return (
        f"no room for a KV pool on {device}: --kv-budget-mb {budget / MiB:g} holds "
        f"{budget // bytes_per_token:,} tokens ({bytes_per_token:,} bytes each), less than two pages of "
        f"{page_size:,} (one is the reserved dummy page); raise --kv-budget-mb or lower --page-size"
    )


def graph_buffers_estimate(
    spec: Any, dtype: torch.dtype, decode_max_bs: int, max_pages: int, prefill_max_tokens: int
) -> int:
    """Bytes the graph runners' static buffers take before any capture: decode logits (float32) and page
    table rows; prefill bridge buffers (q, k, v, attention out), hidden output and the MLP's widest
    activation (a mixture of experts': each of a token's experts' gate|up, SiLU·mul and output rows). An
    estimate to refuse the impossible early, not a measurement."""
    size = torch.empty((), dtype=dtype).element_size()
    decode = decode_max_bs * (spec.vocab_size * 4 + max_pages * 8)
    experts = spec.num_experts_per_tok * (3 * spec.moe_intermediate_size + spec.hidden_size)
    mlp = max(2 * spec.intermediate_size, experts)
    per_token = ((2 * spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim + spec.hidden_size + mlp) * size
    return decode + prefill_max_tokens * per_token


def check_graph_buffers_fit(
    spec: Any, dtype: torch.dtype, device: torch.device, decode_max_bs: int, max_pages: int, prefill_max_tokens: int
) -> None:
    need = graph_buffers_estimate(spec, dtype, decode_max_bs, max_pages, prefill_max_tokens)
    what = f"graph buffers for decode bs {decode_max_bs:,} and prefill {prefill_max_tokens:,} tokens"
    problem = fit_problem(what, need, device)
    if problem:
        raise MemoryPlanError(f"{problem}; use smaller buckets")


def graph_reserve_estimate(device: torch.device) -> int:
    """Room kept for graph pools before they are measured (replaced by measurements after capture)."""
    return 1024 * MiB if device.type == "cuda" else 0
