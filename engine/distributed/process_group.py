"""The torch.distributed group of a tensor-parallel run: NCCL between GPUs, gloo on CPU.

Every rank calls ``join_group`` with the same store path (a file in a folder rank 0 made: no port to
pick, nothing to collide with another run on the machine). On CUDA a second, gloo group carries the
small host-side agreements (pages, buckets) so that they never queue behind kernels.

NVLink multicast stays off: ``MULTICAST_OFF`` goes into the environment before the workers are spawned
(they inherit it) and before anything creates a communicator, so neither NCCL (NVLS) nor torch's
symmetric memory ever asks the driver for a multicast object.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
COLLECTIVE_TIMEOUT = timedelta(minutes=10)
"""How long a collective may wait for a peer. A dead peer is noticed long before (gloo fails at once
on a closed socket; the group's monitor watches the worker processes)."""


def multicast_off() -> None:
    """Keep NVLink multicast off in this process and every process it spawns (an explicit setting in
    the environment is left as it is)."""
    for key, value in MULTICAST_OFF.items():
        os.environ.setdefault(key, value)


@dataclass
class RankGroup:
    """This process's membership: rank, size, device, the main group and the host-side one."""

    rank: int
    size: int
    device: torch.device
    cpu_group: Optional[dist.ProcessGroup]  # gloo; None: the main group is gloo already

    def agree_min(self, values: list[int]) -> list[int]:
        """The element-wise minimum of ``values`` over every rank (a host-side collective)."""
        t = torch.tensor(values, dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.cpu_group)
        return t.tolist()

    def leave(self) -> None:
        """Destroy the groups (after every graph that holds a collective was released)."""
        if dist.is_initialized():
            dist.destroy_process_group()


def rank_device(base: torch.device, rank: int) -> torch.device:
    """Rank r's device: ``cuda:(base index + r)``; CPU ranks all run on the CPU."""
    if base.type != "cuda":
        return base
    return torch.device("cuda", (base.index or 0) + rank)


def group_in_use() -> Optional[str]:
    """Why this process cannot start a tensor-parallel group, or None. torch.distributed has one default
    group per process, so one tensor-parallel engine per process: asked before any worker is spawned,
    since a second engine would otherwise fail only once its workers had loaded."""
    if dist.is_initialized():
        return (
            "this process already has a torch.distributed process group (another tensor-parallel engine "
            "still open?): one tensor-parallel engine per process; close the other one first"
        )
    return None


def join_group(rank: int, size: int, device: torch.device, store_path: str) -> RankGroup:
    problem = group_in_use()
    if problem:
        raise RuntimeError(problem)
    multicast_off()
    init = f"file://{store_path}"
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group(
            "nccl", init_method=init, rank=rank, world_size=size, timeout=COLLECTIVE_TIMEOUT, device_id=device
        )
        cpu_group = dist.new_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT)
    else:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=size, timeout=COLLECTIVE_TIMEOUT)
        cpu_group = None
    return RankGroup(rank, size, device, cpu_group)
