"""ModelSpec: the architecture facts the engine and the decoder need, frozen.

Derived once from a transformers config (``registry.spec_from_hf_config``, which owns the per-family
knowledge) so nothing downstream touches the HF config
object (whose layout moved between transformers 4 and 5: rope settings live in
`config.rope_parameters` in v5, in `rope_theta` + `rope_scaling` in v4; both are read).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

from .errors import CheckpointError

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
# Rope types whose config carries the pretraining context; HF fills it in when absent.
_ROPE_WITH_ORIGINAL_MAX = ("llama3", "yarn")


@dataclass(frozen=True)
class ModelSpec:
    """Shape and numerics of a Llama/Mistral/Qwen2/Qwen3-style decoder.

    `rope_scaling` is None for plain rope, else a normalised dict with `rope_type` set
    (no `rope_theta`, no legacy `type` key). It makes the spec unhashable; compare, don't hash.
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

    @property
    def rope_type(self) -> str:
        return self.rope_scaling["rope_type"] if self.rope_scaling else "default"

    @property
    def softmax_scale(self) -> float:
        """Attention logit scale for every supported family: head_dim ** -0.5."""
        return self.head_dim**-0.5

    @property
    def max_context_len(self) -> int:
        """Positions the rope cache covers (the engine must not exceed it).

        Usually `max_position_embeddings`; for yarn/llama3 configs that leave it at the
        pretraining length (Qwen's documented yarn recipe does), original * factor.
        """
        extended = 0
        if self.rope_type in _ROPE_WITH_ORIGINAL_MAX and self.rope_scaling.get("factor"):
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


def read_rope(
    config: Any, max_position_embeddings: int, where: str | None = None
) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, normalised rope_scaling or None) from either config layout."""
    params = getattr(config, "rope_parameters", None)
    legacy = getattr(config, "rope_scaling", None)
    raw = dict(params or legacy or {})
    if raw and any(isinstance(v, dict) for v in raw.values()):
        raise CheckpointError(located("per-layer rope parameters are not supported", where))
    theta = raw.pop("rope_theta", None)
    if theta is None:
        theta = getattr(config, "rope_theta", None) or 10000.0
    rope_type = supported_rope_type(raw, where)
    raw.pop("rope_type", None)
    raw.pop("type", None)
    partial = raw.pop("partial_rotary_factor", None) or getattr(config, "partial_rotary_factor", None)
    if partial not in (None, 1, 1.0):
        raise CheckpointError(located(f"partial_rotary_factor={partial} is not supported", where))
    if rope_type == "default":
        return float(theta), None
    if rope_type in _ROPE_WITH_ORIGINAL_MAX:
        raw["original_max_position_embeddings"] = _pretraining_context(config, raw, max_position_embeddings)
    return float(theta), {"rope_type": rope_type, **raw}


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
