"""Which models the fused Triton path can run: the one home of that policy.

The fused kernels implement the pre-norm RMSNorm block (``decoder.DecoderLayer``) with SiLU·mul and
full-width RoPE from one table (embedding scale and the output logits' soft cap sit outside them, attention
windows and soft caps in the attention backend). A model that differs anywhere runs on the shared torch
layers instead, on every device, and the decoder says so once when the fused path is asked for
(``DecoderForCausalLM.enable_fused_kernels``) rather than refusing the checkpoint.
"""

from __future__ import annotations

from typing import Optional

from ..spec import ModelSpec
from .mlp import FUSED_ACTIVATIONS


def spec_problem(spec: ModelSpec) -> Optional[str]:
    """Why the fused kernels cannot run a model of ``spec``'s numerics (one line), or None."""
    if spec.hidden_act not in FUSED_ACTIVATIONS:
        return f"hidden_act '{spec.hidden_act}' (the fused kernels implement SiLU alone)"
    if spec.rotary_dim != spec.head_dim:
        return f"partial rotary (RoPE over {spec.rotary_dim} of {spec.head_dim} dimensions)"
    if spec.local_rope_theta is not None:
        return "the sliding layers rotate with a RoPE table of their own"
    return None
