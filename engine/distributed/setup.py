"""What rank 0 decides once and its workers apply: the KV pool's size and the serving setup."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..graphs.config import ResolvedGraphConfig
from ..kernel_config import KernelConfig
from ..memory_plan import MemoryPlan
from .process_group import RankGroup


@dataclass(frozen=True)
class RankSetup:
    """Rank 0's choices, so that every rank serves with the same backend, kernels and graphs."""

    attention_backend: str  # the backend rank 0 selected ("torch", "flashinfer"), not the config's "auto"
    kernels: KernelConfig  # resolved (environment overrides applied)
    fused_kernels: bool
    fused_gemv_max_rows: int
    resolved: ResolvedGraphConfig
    max_pages: int
    freeze_gc: bool


def agree_plan(group: RankGroup, plan: MemoryPlan) -> MemoryPlan:
    """Every rank's pool gets the same number of pages: the smallest any rank's memory allows (page
    ids are the scheduler's on rank 0, and index every rank's pool alike)."""
    pages = group.agree_min([plan.num_pages])[0]
    return replace(plan, num_pages=pages, kv_pool_bytes=pages * plan.page_size * plan.bytes_per_token)
