"""graphtop.models: HF-format checkpoints -> one compact, CUDA-graph-friendly decoder.

Covers the architectures of models/families/ (``SUPPORTED_ARCHITECTURES``).
The engine calls `model(input_ids, positions, attn)` on a flat ragged batch and
`model.compute_logits(hidden)`, or, for a decode step, `model.decode_logits(input_ids, positions, attn)`
(the final norm may ride in the lm_head's kernel); attention (and the KV cache) is the engine's `attn`.
"""

from .decoder import AttentionFn, DecoderForCausalLM
from .errors import CheckpointError
from .loader import CheckpointMeta, LoadedCheckpoint, load_checkpoint, read_checkpoint
from .registry import SUPPORTED_ARCHITECTURES
from .spec import ModelSpec
from .synthetic.demo import DEMO_NOTE, ensure_demo_model

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
