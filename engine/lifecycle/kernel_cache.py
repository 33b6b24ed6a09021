"""Where compiled Triton kernels live, and whether they are compiled ahead of capture in worker processes.

Why here: one home for the policy. Triton's cache goes in graphtop's cache folder, so the kernels a
cold machine compiled once are loaded from disk at every later start; and on CUDA an engine compiles
each bucket's kernels in worker processes before capturing it (``models/kernels/compile_pool.py``), so
no capture slice, and so no step, waits for a compile.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from graphtop.models.checkpoint.cache import cache_root
from graphtop.models.kernels import precompile
from graphtop.models.kernels.compile_pool import shared_compiler

from ..graphs.runners.kernel_gate import Precompile
from ..kernel_config import KernelConfig

__all__ = ["kernel_cache_folder", "kernel_precompile"]


def kernel_cache_folder(cache_dir: Optional[str] = None) -> Path:
    """graphtop's cache folder (``cache_dir``, else $GRAPHTOP_CACHE_DIR, else the user cache), ``triton/``."""
    return cache_root(cache_dir) / "triton"


def kernel_precompile(
    kernels: KernelConfig, device: torch.device, tp_size: int, cache_dir: Optional[str], setup: str
) -> Optional[Precompile]:
    """Point Triton's cache at graphtop's (CUDA with Triton; $TRITON_CACHE_DIR still wins) and return what
    captures wait for, or None: ``kernels.precompile`` off, no CUDA, a Triton without the hooks
    (``precompile.supported``), or tensor parallel (its ranks capture the same bucket in lockstep, so they
    compile as they capture). ``setup``: everything about the engine that decides which kernel variants
    its graphs launch (the model, dtype, kernel choices, attention), naming the variant manifests."""
    if device.type != "cuda" or not precompile.supported():
        return None
    folder = precompile.point_triton_cache(kernel_cache_folder(cache_dir))
    if kernels.precompile == "off" or tp_size > 1:
        return None
    cache = folder if folder is not None else Path(precompile.triton_cache_dir() or ".")
    setup = f"{setup}|{device}|{torch.cuda.get_device_capability(device)}"
    return Precompile(shared_compiler(), cache, setup)
