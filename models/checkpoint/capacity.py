"""What a device can hold, so a size that would not fit is refused before it is allocated.

An allocation that cannot succeed either ends in an allocator traceback or, on a host, in the OOM
killer taking the whole process (and every other result with it). Every big allocation graphtop makes
from a user-controlled size (weights and rope table from config.json, the KV pool, graph buffers) is
first compared here with what is available, and refused with the estimate in the message.
"""

from __future__ import annotations

from typing import Optional

import torch

GiB = 1 << 30
MiB = 1 << 20


def available_bytes(device: torch.device | str) -> int:
    """Free device memory on CUDA; on a host, the memory the OS says it can give without swapping."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    import psutil

    return int(psutil.virtual_memory().available)


def format_bytes(n: float) -> str:
    if n >= GiB:
        return f"{n / GiB:,.1f} GiB"
    return f"{n / MiB:,.1f} MiB"


def fit_problem(what: str, need_bytes: int, device: torch.device | str) -> Optional[str]:
    """None when ``need_bytes`` fits in what ``device`` has available, else a one-line reason."""
    have = available_bytes(device)
    if need_bytes <= have:
        return None
    return f"{what} needs ~{format_bytes(need_bytes)} but {torch.device(device)} has {format_bytes(have)} available"
