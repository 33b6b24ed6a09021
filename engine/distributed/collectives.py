"""The collectives a sharded model calls (models/parallel's ``Communicator``), over torch.distributed.

All-reduce has two paths on CUDA. NCCL takes every size; a decode step of a large model calls it twice
per layer on a few KiB (Llama-3.1-8B at batch 1: 8 KiB, 64 times a step), where its fixed cost per
call dominates. For those, torch's symmetric-memory one-shot all-reduce reads the peers' buffers over
NVLink directly in one kernel (peer-to-peer loads and a signal-pad barrier: no multicast object, so it
works with NVLink multicast disabled). It is used only when it exists in this torch, below
``SMALL_ALL_REDUCE_BYTES``, and after a self-test (eager and inside a captured graph) passed on every
rank; otherwise NCCL does everything and ``note`` says why. Which path a call takes depends only on
its shape and dtype, so every rank takes the same one, also inside captured graphs.
"""

from __future__ import annotations

import warnings
from typing import Optional

import torch
import torch.distributed as dist

from .process_group import RankGroup

SMALL_ALL_REDUCE_BYTES = 512 * 1024
"""Messages up to this size take the one-shot path (when enabled): the decode-sized ones."""


class SymmMemAllReduce:
    """One-shot all-reduce through one symmetric-memory buffer (``SMALL_ALL_REDUCE_BYTES``)."""

    def __init__(self, group: RankGroup, dtype: torch.dtype) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        self.ops = torch.ops.symm_mem
        if not hasattr(self.ops, "one_shot_all_reduce_out"):
            raise RuntimeError("this torch has no symm_mem.one_shot_all_reduce_out")
        self.name = dist.group.WORLD.group_name
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # enable_symm_mem_for_group is deprecated (and a no-op) in newer torch
            enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
            if enable is not None:
                enable(self.name)
        self.buf = symm_mem.empty(SMALL_ALL_REDUCE_BYTES // dtype.itemsize, dtype=dtype, device=group.device)
        symm_mem.rendezvous(self.buf, self.name)
        self.dtype = dtype
        self.copy_out = getattr(self.ops, "one_shot_all_reduce_copy_out", None)

    def fits(self, x: torch.Tensor) -> bool:
        return x.dtype == self.dtype and x.is_contiguous() and x.numel() <= self.buf.numel()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.view(-1)
        staged = self.buf[: flat.numel()]
        if self.copy_out is not None and flat.data_ptr() % 16 == 0 and (flat.numel() * flat.element_size()) % 16 == 0:
            # one launch: the kernel copies ``flat`` into this rank's buffer before its barrier
            self.copy_out(staged, flat, "sum", self.name, flat)
        else:
            staged.copy_(flat)
            self.ops.one_shot_all_reduce_out(staged, "sum", self.name, flat)
        return x


class TorchCollectives:
    """models/parallel's ``Communicator`` for one rank of the group."""

    def __init__(self, group: RankGroup, small: Optional[SymmMemAllReduce] = None, note: str = "") -> None:
        self.rank, self.size = group.rank, group.size
        self.small = small
        self.note = note or ("gloo" if group.device.type == "cpu" else "nccl")

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.small is not None and self.small.fits(x):
            return self.small(x)
        dist.all_reduce(x)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            out = x.new_empty((self.size * x.shape[0], *x.shape[1:]))
            dist.all_gather_into_tensor(out, x)
            return out
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x)
        return torch.cat(parts)


def build_collectives(group: RankGroup, dtype: torch.dtype, all_reduce: str) -> TorchCollectives:
    """The rank's collectives; every rank calls this at the same point (the one-shot path's setup and
    self-test are collective). ``all_reduce``: KernelConfig.all_reduce ("auto" or "nccl")."""
    if group.device.type != "cuda":
        return TorchCollectives(group)
    if all_reduce == "nccl":
        return TorchCollectives(group, note="nccl (asked for)")
    small: Optional[SymmMemAllReduce] = None
    # Each stage runs only where every rank passed the one before: a rank that went on alone would
    # wait for its peers' signals forever.
    for stage in ("setup", "eager", "graph"):
        problem = ""
        try:
            if stage == "setup":
                small = SymmMemAllReduce(group, dtype)
            else:
                assert small is not None
                problem = _self_test(small, group, graph=stage == "graph")
        except Exception as e:  # an older torch, no P2P between the GPUs, ...
            problem = f"{type(e).__name__}: {e}".splitlines()[0][:160]
        if group.agree_min([0 if problem else 1])[0] == 0:
            why = f"{stage}: {problem}" if problem else f"{stage} failed on a peer"
            return TorchCollectives(group, note=f"nccl (symmetric-memory all-reduce unavailable: {why})")
    return TorchCollectives(group, small, note=f"symm-mem one-shot <= {SMALL_ALL_REDUCE_BYTES // 1024} KiB, nccl above")


def _self_test(small: SymmMemAllReduce, group: RankGroup, graph: bool) -> str:
    """'' when the one-shot all-reduce sums right, eagerly or replayed from a captured CUDA graph."""
    dev = group.device
    x = torch.zeros(4096, dtype=small.dtype, device=dev)
    want = float(sum(range(1, group.size + 1)))
    if graph:
        g = torch.cuda.CUDAGraph()
        torch.cuda.synchronize(dev)
        with torch.cuda.graph(g, stream=torch.cuda.Stream(dev)):
            small(x)
        x.fill_(float(group.rank + 1))
        g.replay()
    else:
        x.fill_(float(group.rank + 1))
        small(x)
    torch.cuda.synchronize(dev)
    return "" if bool((x == want).all()) else f"{'graph replay' if graph else 'eager'} sum wrong"
