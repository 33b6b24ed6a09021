"""How many KV tokens fit: from free device memory on CUDA, from a budget on CPU.

The plan keeps every line (weights, reserves, pool) so the dashboard's memory ledger can show where
each byte went; graph capture later replaces the graph estimate with measured numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

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
    the activation reserve. On CPU: the configured budget (host memory is not ours to take)."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        budget = int(total * mem_fraction_static) - weights_bytes - graph_reserve_bytes
        budget = min(budget, free - activation_reserve_bytes - graph_reserve_bytes)
    else:
        total = cpu_kv_budget_bytes
        budget = cpu_kv_budget_bytes
        activation_reserve_bytes = 0
        graph_reserve_bytes = 0
    tokens = budget // bytes_per_token
    if max_total_tokens is not None:
        tokens = min(tokens, max_total_tokens)
    num_pages = tokens // page_size + 1  # +1: the dummy page
    if num_pages < 2:
        raise MemoryPlanError(
            f"no room for a KV pool on {device}: budget {budget / MiB:.1f} MiB after weights "
            f"({weights_bytes / MiB:.1f} MiB) and reserves; raise --mem-fraction-static or lower reserves"
        )
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
