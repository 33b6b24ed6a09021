"""Pick the attention backend: FlashInfer on CUDA when importable, torch-native otherwise.

The choice and the reason for any fallback are returned as a note that goes into the
engine-started event and the dashboard's status line, so it is never silent.
"""

from __future__ import annotations

import torch

from ..kernel_config import KernelConfig
from ..kv_pool import KVPool
from .base import AttentionBackend, AttentionBackendError, AttentionShape
from .flashinfer_support import flashinfer_problem, kv_cache_problem
from .torch_native import TorchNativeBackend

__all__ = ["AttentionBackendError", "flashinfer_problem", "select_attention_backend"]


def select_attention_backend(
    choice: str, pool: KVPool, shape: AttentionShape, device: torch.device, kernels: KernelConfig = KernelConfig()
) -> tuple[AttentionBackend, str]:
    if choice in ("auto", "flashinfer"):
        problem = flashinfer_problem(device)
        if problem is None:
            problem = kv_cache_problem(pool.layout.dtype, shape.head_dim, pool.page_size)
            if problem is None:
                from .flashinfer_backend import FlashInferBackend

                backend = FlashInferBackend(
                    pool,
                    shape,
                    device,
                    prefill_backend=kernels.prefill_backend,
                    decode_kernel=kernels.decode_kernel,
                    pdl=kernels.pdl,
                )
                return backend, "flashinfer selected"
        if choice == "flashinfer":
            raise AttentionBackendError(f"--attention-backend flashinfer: {problem}")
        note = "torch-native" if device.type == "cpu" else f"torch-native ({problem})"
        return TorchNativeBackend(pool, shape, device), note
    if choice == "torch":
        return TorchNativeBackend(pool, shape, device), "torch-native (asked for)"
    raise AttentionBackendError(f"unknown attention backend {choice!r}; choose auto, flashinfer or torch")
