"""graphtop.models: HF-format checkpoints -> one compact, CUDA-graph-friendly decoder.

Covers the architectures of models/families/ (``SUPPORTED_ARCHITECTURES``).
The engine calls `model(input_ids, positions, attn)` on a flat ragged batch and
`model.compute_logits(hidden)`, or, for a decode step, `model.decode_logits(input_ids, positions, attn)`
(the final norm may ride in the lm_head's kernel); attention (and the KV cache) is the engine's `attn`.

The names below load on first use (PEP 562), not when the package is imported: its torch-free bottom
modules (``text``, the value-quoting rule the engine's telemetry shares) import without loading torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .decoder import AttentionFn, DecoderForCausalLM
    from .errors import CheckpointError
    from .loader import CheckpointMeta, LoadedCheckpoint, load_checkpoint, read_checkpoint
    from .registry import SUPPORTED_ARCHITECTURES
    from .spec import ModelSpec
    from .synthetic.demo import DEMO_NOTE, ensure_demo_model

_HOMES = {
    "AttentionFn": ".decoder",
    "DecoderForCausalLM": ".decoder",
    "CheckpointError": ".errors",
    "CheckpointMeta": ".loader",
    "LoadedCheckpoint": ".loader",
    "load_checkpoint": ".loader",
    "read_checkpoint": ".loader",
    "SUPPORTED_ARCHITECTURES": ".registry",
    "ModelSpec": ".spec",
    "DEMO_NOTE": ".synthetic.demo",
    "ensure_demo_model": ".synthetic.demo",
}

__all__ = [
    "AttentionFn",
    "CheckpointError",
    "CheckpointMeta",
    "DEMO_NOTE",
    "DecoderForCausalLM",
    "LoadedCheckpoint",
    "ModelSpec",
    "SUPPORTED_ARCHITECTURES",
    "ensure_demo_model",
    "load_checkpoint",
    "read_checkpoint",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value  # once: later lookups are plain attributes
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
