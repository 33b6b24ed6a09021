"""Phi-3 and Phi-4-mini (``Phi3ForCausalLM``): the pre-norm decoder without biases, whose checkpoints store q,
k and v stacked in one ``qkv_proj`` and gate and up in one ``gate_up_proj`` (mapped here to the decoder's
separate projections, which the fused path stacks again), LongRoPE scaling ("longrope", the older "su":
short and long factors per frequency, models/layers/rope.py) and a partial rotary factor (Phi-4-mini rotates
three quarters of each head; such a model runs on the torch layers). A ``sliding_window`` applies to every
layer, as transformers applies it.
"""

from __future__ import annotations

from typing import Any, Optional

from ..family import Family, Stored, read_spec
from ..spec import ModelSpec

ARCHITECTURE = "Phi3ForCausalLM"


def read(config: Any, where: Optional[str]) -> ModelSpec:
    return read_spec(config, where, ARCHITECTURE, qkv_bias=False, partial_rotary=True)


def stored(param: str, spec: ModelSpec) -> Stored:
    """q/k/v: rows of ``self_attn.qkv_proj``; gate/up: rows of ``mlp.gate_up_proj``; the rest as named."""
    module, _, kind = param.rpartition(".")
    parent, _, proj = module.rpartition(".")
    q, kv, ffn = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim, spec.intermediate_size
    rows = {"q_proj": (0, q), "k_proj": (q, q + kv), "v_proj": (q + kv, q + 2 * kv)}
    if proj in rows:
        return Stored(f"{parent}.qkv_proj.{kind}", *rows[proj], rows=q + 2 * kv)
    if proj in ("gate_proj", "up_proj"):
        start = 0 if proj == "gate_proj" else ffn
        return Stored(f"{parent}.gate_up_proj.{kind}", start, start + ffn, rows=2 * ffn)
    return Stored(param)


FAMILY = Family(ARCHITECTURE, "phi3", read, stored=stored)
