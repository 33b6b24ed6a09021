"""A decoder layer of a published shape on the meta device, its projections fused as the fused-kernel path
fuses them: what the kernel-policy tests hand their settings to (no weights, no GPU)."""

from __future__ import annotations

from typing import Any

import torch

from graphtop.models.decoder import DecoderLayer
from graphtop.models.registry import spec_from_hf_config
from graphtop.models.synthetic.random_model import hf_config_for


def fused_layer(shape: str = "qwen3-0.6b", **overrides: Any) -> DecoderLayer:
    spec = spec_from_hf_config(hf_config_for(shape, num_hidden_layers=1, **overrides), "<test>")
    with torch.device("meta"):
        layer = DecoderLayer(spec, 0)
    layer.self_attn.fuse()
    layer.mlp.fuse()
    return layer
