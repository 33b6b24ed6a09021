"""Architecture registry: `config.architectures[0]` -> implementation and family flags.

All four families are one `DecoderForCausalLM`; they differ only in flags:

* Llama: `attention_bias` puts biases on q, k, v *and* o; `mlp_bias` on the MLP.
* Mistral: no biases. HF applies sliding-window attention whenever `sliding_window` is
  set. We do not implement SWA, so a window that is null or >= max_position_embeddings
  (it can never mask anything) is accepted and recorded in `spec.sliding_window`; a
  smaller one is refused with CheckpointError rather than silently producing wrong output.
* Qwen2: q, k, v biases always, o never. Same sliding-window rule (HF nulls the window
  unless `use_sliding_window`).
* Qwen3: per-head RMSNorm on q and k (`q_norm`/`k_norm`); `attention_bias` as in Llama.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from torch import nn

from .decoder import DecoderForCausalLM
from .errors import CheckpointError
from .spec import ModelSpec, as_int_tuple, located, read_rope


def _flag(name: str) -> Callable[[Any], bool]:
    return lambda config: bool(getattr(config, name, False))


def _const(value: bool) -> Callable[[Any], bool]:
    return lambda config: value


@dataclass(frozen=True)
class Family:
    """How one HF architecture maps onto the shared decoder."""

    model_cls: type[nn.Module]
    model_type: str
    qkv_bias: Callable[[Any], bool]
    o_bias: Callable[[Any], bool]
    mlp_bias: Callable[[Any], bool]
    qk_norm: bool


_NO = _const(False)
ARCHITECTURES: dict[str, Family] = {
    "LlamaForCausalLM": Family(
        DecoderForCausalLM,
        "llama",
        qkv_bias=_flag("attention_bias"),
        o_bias=_flag("attention_bias"),
        mlp_bias=_flag("mlp_bias"),
        qk_norm=False,
    ),
    "MistralForCausalLM": Family(DecoderForCausalLM, "mistral", qkv_bias=_NO, o_bias=_NO, mlp_bias=_NO, qk_norm=False),
    "Qwen2ForCausalLM": Family(
        DecoderForCausalLM, "qwen2", qkv_bias=_const(True), o_bias=_NO, mlp_bias=_NO, qk_norm=False
    ),
    "Qwen3ForCausalLM": Family(
        DecoderForCausalLM,
        "qwen3",
        qkv_bias=_flag("attention_bias"),
        o_bias=_flag("attention_bias"),
        mlp_bias=_NO,
        qk_norm=True,
    ),
}
SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(ARCHITECTURES)
_BY_MODEL_TYPE = {family.model_type: name for name, family in ARCHITECTURES.items()}


def architecture_name(config: Any) -> str:
    """`architectures[0]`, falling back to `model_type` for configs saved without it.

    Accepts a transformers config or the raw config.json dict.
    """
    get = config.get if isinstance(config, dict) else lambda k: getattr(config, k, None)
    archs = get("architectures") or []
    if archs:
        return str(archs[0])
    return _BY_MODEL_TYPE.get(str(get("model_type")), f"<none; model_type={get('model_type')!r}>")


def resolve(name: str, where: str | None = None) -> Family:
    """The family for an architecture name, or CheckpointError listing what is supported."""
    try:
        return ARCHITECTURES[name]
    except KeyError:
        suffix = f" (in {where})" if where else ""
        raise CheckpointError(
            f"unsupported architecture '{name}'; supported: {', '.join(SUPPORTED_ARCHITECTURES)}{suffix}"
        ) from None


def check_model_type(config: dict[str, Any], where: str | None = None) -> None:
    """Refuse a config.json whose ``architectures[0]`` and ``model_type`` name different families: graphtop
    builds the first, transformers (AutoConfig, and the parity reference) the second, so one of the two
    silently serves another model (Qwen3's q/k norms dropped, Qwen2's biases ignored, ...)."""
    archs, model_type = config.get("architectures") or [], config.get("model_type")
    if not archs or model_type is None:
        return
    family = resolve(str(archs[0]), where)
    if model_type != family.model_type:
        raise CheckpointError(
            located(
                f"config.json: 'architectures' names {archs[0]} (model_type '{family.model_type}') but 'model_type' is "
                f"{model_type!r}, which transformers would build instead: refused",
                where,
            )
        )


def spec_from_hf_config(config: Any, where: str | None = None) -> ModelSpec:
    """Freeze a transformers config (v4 or v5 layout) into a ModelSpec, refusing what we can't run."""
    name = architecture_name(config)
    family = resolve(name, where)
    act = getattr(config, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise CheckpointError(located(f"unsupported hidden_act '{act}' (only silu/SwiGLU is implemented)", where))
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    if heads % kv_heads:
        problem = f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}"
        raise CheckpointError(located(problem, where))
    max_pos = int(config.max_position_embeddings)
    window = getattr(config, "sliding_window", None)
    if window is not None and int(window) < max_pos:
        problem = (
            f"sliding_window={window} < max_position_embeddings={max_pos}: sliding-window attention is not implemented"
        )
        raise CheckpointError(located(problem, where))
    theta, scaling = read_rope(config, max_pos, where)
    return ModelSpec(
        architecture=name,
        vocab_size=int(config.vocab_size),
        hidden_size=int(config.hidden_size),
        intermediate_size=int(config.intermediate_size),
        num_layers=int(config.num_hidden_layers),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=int(getattr(config, "head_dim", None) or config.hidden_size // heads),
        rms_norm_eps=float(config.rms_norm_eps),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=max_pos,
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        qkv_bias=family.qkv_bias(config),
        qk_norm=family.qk_norm,
        eos_token_ids=as_int_tuple(getattr(config, "eos_token_id", None)),
        bos_token_id=getattr(config, "bos_token_id", None),
        o_bias=family.o_bias(config),
        mlp_bias=family.mlp_bias(config),
        sliding_window=None if window is None else int(window),
    )


def model_class(spec: ModelSpec) -> type[nn.Module]:
    return resolve(spec.architecture).model_cls
