"""What a model family is: how one transformers architecture becomes a ModelSpec and a decoder.

A family is one file in models/families/ defining ``FAMILY = Family(...)``: its config reading (``read``,
usually ``read_spec`` with the family's own facts), where its checkpoints store each parameter
(``stored``: HF's names as they are for most families) and its model (``model``: ``DecoderForCausalLM``,
or a subclass composing other shared layers). models/registry.py lists the families, one line each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from torch import nn

from .decoder import DecoderForCausalLM
from .errors import CheckpointError
from .layers.mlp import ACTIVATIONS
from .spec import ModelSpec, RopeSettings, as_int_tuple, located, read_rope


@dataclass(frozen=True)
class Stored:
    """Where a parameter's values are in a checkpoint: tensor ``name`` whole, or rows [start, stop) of its
    ``rows`` (a tensor that stacks several parameters: Phi-3's qkv_proj and gate_up_proj)."""

    name: str
    start: int = 0
    stop: Optional[int] = None
    rows: Optional[int] = None

    def shape(self, param_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The stored tensor's shape, for a parameter of ``param_shape``."""
        return param_shape if self.rows is None else (self.rows, *param_shape[1:])


def stored_as_named(param: str, spec: ModelSpec) -> Stored:
    """The default: every parameter stored under its own (transformers') name."""
    return Stored(param)


@dataclass(frozen=True)
class Family:
    """One architecture: ``read(config, where) -> ModelSpec``, ``model(spec)`` the decoder, ``stored(param,
    spec)`` where a parameter is in the checkpoint. ``tensor_parallel``: whether models/parallel/ can shard
    its model (its layers are the pre-norm block the tensor-parallel layout names)."""

    architecture: str
    model_type: str
    read: Callable[[Any, Optional[str]], ModelSpec]
    model: type[nn.Module] = DecoderForCausalLM
    stored: Callable[[str, ModelSpec], Stored] = stored_as_named
    tensor_parallel: bool = True


def read_sliding(config: Any) -> tuple[Optional[int], tuple[int, ...]]:
    """(sliding_window, the layers it applies to): those whose ``layer_types`` entry is "sliding_attention",
    or every layer where the config has no ``layer_types`` (Mistral, Phi-3: transformers then masks every
    layer by the window). transformers nulls the window of a config that does not use it (Qwen2's
    ``use_sliding_window`` false)."""
    window = getattr(config, "sliding_window", None)
    if window is None:
        return None, ()
    types = getattr(config, "layer_types", None)
    if types is None:
        return int(window), tuple(range(int(config.num_hidden_layers)))
    return int(window), tuple(i for i, kind in enumerate(types) if kind == "sliding_attention")


def read_spec(
    config: Any,
    where: Optional[str],
    architecture: str,
    *,
    qkv_bias: bool,
    o_bias: bool = False,
    mlp_bias: bool = False,
    qk_norm: bool = False,
    sliding: bool = True,
    partial_rotary: bool = False,
    rope: Optional[RopeSettings] = None,
    activation_key: str = "hidden_act",
    activation_default: str = "silu",
    **family: Any,
) -> ModelSpec:
    """The ModelSpec of ``architecture``'s transformers config (v4 or v5 layout) with the family's facts,
    refusing what graphtop cannot run. ``sliding``: the family honours ``sliding_window`` (``read_sliding``);
    ``partial_rotary``: it rotates part of each head where the config says so; ``rope``: the RoPE the family
    read itself; ``activation_key``: the config key naming the MLP's activation (``activation_default`` where
    the config leaves it out); ``family``: more ModelSpec fields."""
    act = str(getattr(config, activation_key, None) or activation_default)
    if act not in ACTIVATIONS:
        supported = ", ".join(ACTIVATIONS)
        raise CheckpointError(located(f"unsupported {activation_key} '{act}' (supported: {supported})", where))
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    if heads % kv_heads:
        problem = f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}"
        raise CheckpointError(located(problem, where))
    max_pos = int(config.max_position_embeddings)
    rope = rope or read_rope(config, max_pos, where)
    if rope.partial_rotary_factor != 1.0 and not partial_rotary:
        problem = f"partial_rotary_factor={rope.partial_rotary_factor} is not supported for {architecture}"
        raise CheckpointError(located(problem, where))
    window, sliding_layers = read_sliding(config) if sliding else (None, ())
    return ModelSpec(
        architecture=architecture,
        vocab_size=int(config.vocab_size),
        hidden_size=int(config.hidden_size),
        intermediate_size=int(config.intermediate_size),
        num_layers=int(config.num_hidden_layers),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=int(getattr(config, "head_dim", None) or config.hidden_size // heads),
        rms_norm_eps=float(config.rms_norm_eps),
        rope_theta=rope.theta,
        rope_scaling=rope.scaling,
        max_position_embeddings=max_pos,
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        qkv_bias=qkv_bias,
        qk_norm=qk_norm,
        eos_token_ids=as_int_tuple(getattr(config, "eos_token_id", None)),
        bos_token_id=getattr(config, "bos_token_id", None),
        o_bias=o_bias,
        mlp_bias=mlp_bias,
        sliding_window=window,
        sliding_layers=sliding_layers,
        hidden_act=act,
        partial_rotary_factor=rope.partial_rotary_factor,
        **family,
    )


def flag(config: Any, key: str) -> bool:
    """A config's boolean, false where absent (transformers 4 configs lack some)."""
    return bool(getattr(config, key, False))


def positive(config: Any, key: str) -> Optional[float]:
    """A config's optional positive number as a float (soft caps), None where absent or null."""
    value = getattr(config, key, None)
    return None if value is None else float(value)


def read_experts(config: Any, where: Optional[str], experts_key: str, width_key: str) -> dict[str, Any]:
    """A mixture of experts' ModelSpec fields: ``num_experts`` from ``experts_key``, ``num_experts_per_tok``,
    and each expert's MLP width from ``width_key``, refusing counts no router can take."""
    experts, top_k = getattr(config, experts_key, None), getattr(config, "num_experts_per_tok", None)
    width = getattr(config, width_key, None)
    for key, value in ((experts_key, experts), ("num_experts_per_tok", top_k), (width_key, width)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(located(f"config.json: '{key}' must be a positive integer, got {value!r}", where))
    if top_k > experts:
        problem = f"config.json: 'num_experts_per_tok' ({top_k}) is above '{experts_key}' ({experts})"
        raise CheckpointError(located(problem, where))
    return dict(num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=width)
