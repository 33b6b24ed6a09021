"""The HBM floor of a decode step: the one definition every benchmark reports against.

floor = bytes the step must read from HBM ÷ the device-to-device copy bandwidth measured in the same
run. The bytes: every weight, except that an untied input embedding contributes only the rows the
step looks up (one per token); plus the KV bytes of the batch's contexts (every layer reads every
cached token of every request once). A tied embedding is read whole by the lm_head, so it counts
whole. Activations and the logits are left out: they are small next to weights and KV, and leaving
them out keeps the floor a floor.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

COPY_BYTES = 2 << 30  # the copy that measures bandwidth: >= 2 GiB, far past L2


def copy_bandwidth(device: torch.device, nbytes: int = COPY_BYTES) -> float:
    """Bytes/s of a large device-to-device copy, counting bytes read plus bytes written (best of 10)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize(device)
    best = float("inf")
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        dst.copy_(src)
        e.record()
        e.synchronize()
        best = min(best, s.elapsed_time(e) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / best


def kv_bytes_per_token(spec: Any, elem_bytes: int = 2) -> int:
    """K and V of one token across all layers."""
    return 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * elem_bytes


def decode_bytes(model: Any, contexts: Sequence[int]) -> int:
    """Bytes a decode step of ``len(contexts)`` requests with these context lengths must read."""
    spec = model.spec
    params = {id(p): p for p in model.parameters()}  # a tied lm_head is one parameter, counted once
    weights = sum(p.numel() * p.element_size() for p in params.values())
    embed = model.model.embed_tokens.weight
    if not spec.tie_word_embeddings:
        row = embed.shape[1] * embed.element_size()
        weights += len(contexts) * row - embed.numel() * embed.element_size()
    return weights + sum(contexts) * kv_bytes_per_token(spec, embed.element_size())


def floor_ms(model: Any, contexts: Sequence[int], bandwidth: float) -> float:
    return decode_bytes(model, contexts) / bandwidth * 1e3
