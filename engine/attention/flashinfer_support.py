"""Can FlashInfer serve here? Answered without importing ``flashinfer`` where possible.

The attention-backend choice (``select``) asks before building anything, and the backend asks again
when built directly; both read these checks, so the reasons they give are the same.
"""

from __future__ import annotations

from typing import Optional

import torch

from .base import AttentionBackendError

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
SUPPORTED_HEAD_DIMS = (64, 128, 256)


class FlashInferUnsupported(AttentionBackendError):
    """FlashInfer cannot serve this model/pool (dtype, head_dim, page size or device)."""


def flashinfer_problem(device: torch.device) -> Optional[str]:
    """Why FlashInfer cannot run on ``device`` (no CUDA, or the package does not import); None when it can."""
    if device.type != "cuda":
        return "flashinfer needs a CUDA device"
    try:
        import flashinfer  # noqa: F401  (import check only)
    except Exception as e:  # ImportError, or a broken install raising something else
        return f"flashinfer is not importable ({type(e).__name__}: {e})".splitlines()[0]
    return None


def kv_cache_problem(dtype: torch.dtype, head_dim: int, page_size: int) -> Optional[str]:
    """Why FlashInfer cannot serve a KV cache of this dtype / head_dim / page size; None if it can."""
    if dtype not in SUPPORTED_DTYPES:
        name = str(dtype).replace("torch.", "")
        return f"flashinfer kernels need float16 or bfloat16, not {name}"
    if head_dim not in SUPPORTED_HEAD_DIMS:
        dims = ", ".join(str(d) for d in SUPPORTED_HEAD_DIMS)
        return f"flashinfer kernels are built for head_dim {dims}, not {head_dim}"
    if page_size < 1:
        return f"page size must be >= 1, got {page_size}"
    return None
