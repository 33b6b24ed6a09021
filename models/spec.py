"""ModelSpec: the architecture facts the engine and the decoder need, frozen.

Derived once from a transformers config (``registry.spec_from_hf_config``: each family's ``read`` in
models/families/ owns its knowledge) so nothing downstream touches the HF config object (whose layout
moved between transformers 4 and 5: rope settings live in `config.rope_parameters` in v5, in `rope_theta`
+ `rope_scaling` in v4; both are read).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

from .errors import CheckpointError

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")
# Rope types whose config carries the pretraining context; HF fills it in when absent.
_ROPE_WITH_ORIGINAL_MAX = ("llama3", "yarn", "longrope")
# Of those, the ones whose max_position_embeddings may still be the pretraining length (the context is then
# original * factor); a longrope config's max_position_embeddings is the extended context already.
_ROPE_EXTENDING_MAX = ("llama3", "yarn")


@dataclass(frozen=True)
class ModelSpec:
    """Shape and numerics of a decoder of any supported family (models/families/), read once from its config.

    `rope_scaling` is None for plain rope, else a normalised dict with `rope_type` set
    (no `rope_theta`, no legacy `type` key). It makes the spec unhashable; compare, don't hash.
    The fields after ``sliding_window`` default to the Llama family's values, so a family sets only what
    it changes.
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    o_bias: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None
    #: the layers of the sliding type, which attend within ``sliding_window`` keys (the query's own included)
    #: and rotate with the local RoPE where the family has one; the others see the whole context
    sliding_layers: tuple[int, ...] = ()
    #: the MLP's activation, as transformers names it (``layers.activation.ACTIVATIONS``)
    hidden_act: str = "silu"
    #: the attention logits' scale where it is not head_dim ** -0.5 (Gemma: query_pre_attn_scalar ** -0.5)
    attn_scale: float | None = None
    #: cap * tanh(logit / cap) on the attention logits (Gemma 2)
    attn_softcap: float | None = None
    #: cap * tanh(logit / cap) on the output logits (Gemma 2 and 3)
    final_softcap: float | None = None
    #: the embeddings are multiplied by this, rounded to the model's dtype (Gemma: sqrt(hidden_size))
    embed_scale: float | None = None
    #: the share of each head's dimensions that RoPE rotates (the first ones); the rest pass through
    partial_rotary_factor: float = 1.0
    #: the sliding layers' own RoPE base and scaling (Gemma 3's rope_local_base_freq); None: the model's
    local_rope_theta: float | None = None
    local_rope_scaling: dict[str, Any] | None = None
    #: mixture of experts (Qwen3-MoE, Mixtral): experts per sparse layer (0: a dense model), experts each token
    #: takes, and each expert's MLP width (``intermediate_size`` stays the dense layers')
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    #: the top-k routing weights are renormalised to sum to one (Mixtral always; Qwen3-MoE's norm_topk_prob)
    norm_topk_prob: bool = False
    #: the layers whose MLP is the sparse experts block; the others have the dense MLP
    moe_layers: tuple[int, ...] = ()

    @property
    def rope_type(self) -> str:
        return self.rope_scaling["rope_type"] if self.rope_scaling else "default"

    @property
    def softmax_scale(self) -> float:
        """Attention logit scale: head_dim ** -0.5 unless the family says otherwise (``attn_scale``)."""
        return self.head_dim**-0.5 if self.attn_scale is None else self.attn_scale

    @property
    def rotary_dim(self) -> int:
        """How many of each head's dimensions RoPE rotates (transformers' ``int(head_dim * factor)``)."""
        return int(self.head_dim * self.partial_rotary_factor)

    def window(self, layer: int) -> int | None:
        """Keys a query of ``layer`` attends to at most (its own included), or None: the whole context (also
        where the window is as long as the context, so it can never mask)."""
        w = self.sliding_window
        return w if w is not None and w < self.max_context_len and layer in self.sliding_layers else None

    def layer_windows(self) -> tuple[int | None, ...]:
        """``window`` of every layer, what the attention backends mask by."""
        return tuple(self.window(i) for i in range(self.num_layers))

    @property
    def kv_window(self) -> int | None:
        """Keys any layer still reads behind a query (its own included), or None where some layer sees the whole
        context: with every layer windowed (Mistral with ``sliding_window``), KV older than the widest window is
        read by no layer again; one global layer (Gemma's) keeps it all."""
        windows = self.layer_windows()
        if not windows or any(w is None for w in windows):
            return None
        return max(w for w in windows if w is not None)

    def sparse(self, layer: int) -> bool:
        """Whether ``layer``'s MLP is the mixture of experts (``moe_layers``)."""
        return layer in self.moe_layers

    def local_rope(self, layer: int) -> bool:
        """Whether ``layer`` rotates with the sliding layers' own RoPE (``local_rope_theta``)."""
        return self.local_rope_theta is not None and layer in self.sliding_layers

    @property
    def max_context_len(self) -> int:
        """Positions the rope cache covers (the engine must not exceed it).

        Usually `max_position_embeddings`; for yarn/llama3 configs that leave it at the
        pretraining length (Qwen's documented yarn recipe does), original * factor.
        """
        extended = 0
        if self.rope_type in _ROPE_EXTENDING_MAX and self.rope_scaling.get("factor"):
            extended = int(self.rope_scaling["original_max_position_embeddings"] * self.rope_scaling["factor"])
        return max(self.max_position_embeddings, extended)


def located(message: str, where: str | None) -> str:
    """Append the checkpoint path when known, so messages stay one line and name it."""
    return f"{message} in {where}" if where else message


def as_int_tuple(value: Any) -> tuple[int, ...]:
    """eos_token_id may be an int, a list, or None in HF configs. Values are checked before
    (config_check.token_id_problem); ``operator.index`` still refuses a float or string rather than
    truncating or iterating it."""
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(operator.index(v) for v in value)


def supported_rope_type(rope: dict[str, Any], where: str | None = None) -> str:
    """The rope dict's type (``rope_type``, the legacy ``type``, else "default"), or CheckpointError when
    this engine has no kernel for it. Also run on the raw config.json (config_check), before transformers
    sees the dict and warns about a type it does not know."""
    rope_type = rope.get("rope_type") or rope.get("type") or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise CheckpointError(
            located(f"unsupported rope_type {_quoted(rope_type)} (supported: {', '.join(SUPPORTED_ROPE_TYPES)})", where)
        )
    return rope_type


def _quoted(value: Any) -> str:
    return f"'{value}'" if isinstance(value, str) else repr(value)


@dataclass(frozen=True)
class RopeSettings:
    """A config's RoPE: base, normalised scaling dict (None: plain rope) and the rotated share of a head."""

    theta: float
    scaling: dict[str, Any] | None
    partial_rotary_factor: float = 1.0


def read_rope(
    config: Any, max_position_embeddings: int, where: str | None = None, params: dict[str, Any] | None = None
) -> RopeSettings:
    """The RoPE settings from either config layout; ``params``: a rope dict to read instead of the config's
    (one layer type's, where the config holds a dict per layer type: Gemma 3)."""
    if params is None:
        params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    raw = dict(params or {})
    if raw and any(isinstance(v, dict) for v in raw.values()):
        raise CheckpointError(located("per-layer rope parameters are not supported", where))
    theta = raw.pop("rope_theta", None)
    if theta is None:
        theta = getattr(config, "rope_theta", None) or 10000.0
    rope_type = supported_rope_type(raw, where)
    raw.pop("rope_type", None)
    raw.pop("type", None)
    partial = raw.pop("partial_rotary_factor", None) or getattr(config, "partial_rotary_factor", None) or 1.0
    if rope_type == "default":
        return RopeSettings(float(theta), None, float(partial))
    if rope_type in _ROPE_WITH_ORIGINAL_MAX:
        raw["original_max_position_embeddings"] = _pretraining_context(config, raw, max_position_embeddings)
    return RopeSettings(float(theta), {"rope_type": rope_type, **raw}, float(partial))


def _pretraining_context(config: Any, rope: dict[str, Any], max_position_embeddings: int) -> int:
    """The ``original_max_position_embeddings`` transformers rotates by (``standardize_rope_params``, run again
    when it builds the model): a top-level one (Phi3-style) wins over the rope dict's, which defaults to
    ``max_position_embeddings``. Read here, not from the config object's rope dict: transformers standardised
    that before setting the top-level key, so it still shows the default, and serving it would rotate every
    position differently from the reference."""
    top_level = getattr(config, "original_max_position_embeddings", None)
    if top_level is not None:
        return top_level
    return rope.get("original_max_position_embeddings", max_position_embeddings)
