"""Validate a checkpoint's config.json before anything is built from it.

The one home for what a config.json value may be. Runs on the raw JSON object, before transformers'
AutoConfig sees it: a wrong type or range then fails in milliseconds with the key's name, instead of as
a ZeroDivisionError, an allocator traceback, minutes of building a million layers, or (worst) a model
that loads and answers every prompt with an empty "eos" (``rope_theta`` -1, a linear rope factor of 0).
Sizes are then compared with the machine (``check_model_fits``): a model whose weights and rope table
would not fit is refused with the estimate, before any allocation.
"""

from __future__ import annotations

import logging
import math
import re
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Iterator, Optional

import torch

from ..errors import CheckpointError
from ..registry import model_class
from ..spec import ModelSpec, located, supported_rope_type
from ..text import short_repr
from .capacity import fit_problem, format_bytes

log = logging.getLogger(__name__)

MAX_DIM = 2**31 - 1
"""Any size (vocabulary, hidden, positions, ...): beyond this, torch's 32-bit indexing breaks first."""
MAX_LAYERS = 1024
"""Far above any released decoder (Llama-3.1-405B has 126); a bigger count is a broken config."""

_SIZES_REQUIRED = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "max_position_embeddings",
)
_SIZES_OPTIONAL = ("num_key_value_heads", "head_dim", "sliding_window")
_FLAGS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "use_sliding_window")
_ROPE_DICTS = ("rope_parameters", "rope_scaling")


def _fail(message: str, where: Optional[str]) -> CheckpointError:
    return CheckpointError(located(f"config.json: {message}", where))


def _finite(v: float) -> bool:
    try:
        return math.isfinite(v)
    except OverflowError:  # an int too large for a float
        return False


def _size(config: dict[str, Any], key: str, where: Optional[str], required: bool) -> None:
    if key not in config or (config[key] is None and not required):
        if required:
            raise _fail(f"'{key}' is missing", where)
        return
    v = config[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise _fail(f"'{key}' must be an integer, got {short_repr(v)}", where)
    hi = MAX_LAYERS if key == "num_hidden_layers" else MAX_DIM
    if not 1 <= v <= hi:
        raise _fail(f"'{key}' must be in [1, {hi}], got {short_repr(v)}", where)


def _number(
    d: dict[str, Any], key: str, where: Optional[str], *, above: float, at_most: float = math.inf, what: str = ""
) -> None:
    """A finite number in (above, at_most], if present."""
    v = d.get(key)
    if v is None:
        return
    name = f"{what}{key}"
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not _finite(v):
        raise _fail(f"'{name}' must be a finite number, got {short_repr(v)}", where)
    if not above < v <= at_most:
        bound = f"> {above:g}" if at_most == math.inf else f"in ({above:g}, {at_most:g}]"
        raise _fail(f"'{name}' must be {bound}, got {short_repr(v)}", where)


USED_TOKEN_IDS = ("eos_token_id", "bos_token_id")
"""The special token ids graphtop reads from config.json; any other ``*_token_id`` (pad, sep, ...) it never
uses."""


def token_id_problem(key: str, value: Any, vocab_size: int) -> Optional[str]:
    """Why ``value`` is not a token id (an int, not a bool) in [0, vocab_size) or a non-empty list of them,
    or None. The one rule for config.json and generation_config.json: a float would be truncated, a bool
    read as 0 or 1, and an id outside the vocabulary can never be generated (nor embedded)."""
    values = value if isinstance(value, list) else [value]
    if values and all(not isinstance(t, bool) and isinstance(t, int) and 0 <= t < vocab_size for t in values):
        return None
    return f"'{key}' must be a token id in [0, {vocab_size}) or a list of them, got {short_repr(value)}"


def _token_ids(config: dict[str, Any], key: str, where: Optional[str]) -> None:
    if config.get(key) is not None:
        problem = token_id_problem(key, config[key], config["vocab_size"])
        if problem:
            raise _fail(problem, where)


def ignored_token_ids(config: dict[str, Any], where: Optional[str] = None) -> tuple[str, ...]:
    """The ``*_token_id`` keys graphtop does not use (pad, sep, ...) whose value is not a token id of the
    vocabulary (an integer out of range): ignored with one warning line, as vLLM ignores them (many Hub configs store
    ``pad_token_id: -1``); the loader sets them to None for transformers."""
    ignored = []
    for key, value in config.items():  # another type is transformers' to refuse (its config fields are typed)
        if (
            key.endswith("_token_id")
            and key not in USED_TOKEN_IDS
            and type(value) is int
            and token_id_problem(key, value, config["vocab_size"])
        ):
            log.warning(
                "ignoring config.json %s=%s: not a token id of the vocabulary (graphtop does not use it)%s",
                key,
                short_repr(value),
                f" in {where}" if where else "",
            )
            ignored.append(key)
    return tuple(ignored)


_TOKEN_ID_WARNING = re.compile(r"Model config: (\w+_token_id) must be ")


@contextmanager
def no_token_id_warning(keys: Optional[tuple[str, ...]]) -> Iterator[None]:
    """transformers warns about an out-of-vocabulary ``*_token_id`` while it builds a config (its kwargs are
    applied after that check). For ``keys`` (None: every token id) this module already decided: refused
    with one line, or ignored with one line of ours; transformers' louder line would only repeat it."""
    logger = logging.getLogger("transformers.configuration_utils")

    def keep(record: logging.LogRecord) -> bool:
        found = _TOKEN_ID_WARNING.match(record.getMessage())
        return found is None or (keys is not None and found.group(1) not in keys)

    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


def _pretraining_context(config: dict[str, Any], where: Optional[str], what: str = "") -> None:
    """``original_max_position_embeddings``, in a rope dict or at the top level (Phi3-style, where
    transformers gives it precedence: spec.read_rope)."""
    original = config.get("original_max_position_embeddings")
    if original is not None and (
        isinstance(original, bool) or not isinstance(original, int) or not 1 <= original <= MAX_DIM
    ):
        raise _fail(
            f"'{what}original_max_position_embeddings' must be in [1, {MAX_DIM}], got {short_repr(original)}", where
        )


def _rope(config: dict[str, Any], where: Optional[str]) -> None:
    _number(config, "rope_theta", where, above=1.0)
    _pretraining_context(config, where)
    for key in _ROPE_DICTS:
        rope = config.get(key)
        if rope is None:
            continue
        if not isinstance(rope, dict):
            raise _fail(f"'{key}' must be an object, got {short_repr(rope)}", where)
        what = f"{key}."
        if not any(isinstance(v, dict) for v in rope.values()):  # per-layer dicts: refused by read_rope
            supported_rope_type(rope, where)
        _number(rope, "rope_theta", where, above=1.0, what=what)
        for name in ("factor", "low_freq_factor", "high_freq_factor", "attention_factor", "beta_fast", "beta_slow"):
            _number(rope, name, where, above=0.0, what=what)
        for name in ("mscale", "mscale_all_dim"):
            _number(rope, name, where, above=-math.inf, what=what)
        _pretraining_context(rope, where, what)
        low, high = rope.get("low_freq_factor"), rope.get("high_freq_factor")
        if low is not None and high is not None and not high > low:
            raise _fail(f"'{what}high_freq_factor' ({high}) must be above low_freq_factor ({low})", where)


def check_architecture_fields(config: dict[str, Any], where: Optional[str] = None) -> None:
    """'architectures' and 'model_type', which pick the family (checked first: the other checks apply
    to a supported family only)."""
    archs = config.get("architectures")
    if archs is not None and (not isinstance(archs, list) or not all(isinstance(a, str) for a in archs)):
        raise _fail(f"'architectures' must be a list of names, got {short_repr(archs)}", where)
    if config.get("model_type") is not None and not isinstance(config["model_type"], str):
        raise _fail(f"'model_type' must be a name, got {short_repr(config['model_type'])}", where)


def _not_quantized(config: dict[str, Any], where: Optional[str]) -> None:
    """A quantized checkpoint (FP8, GPTQ, AWQ, bitsandbytes, ...) stores weights that only mean something
    with their scales; graphtop has no kernels for them, and reading them as plain weights serves a wrong
    model."""
    quant = config.get("quantization_config")
    if quant is None:
        return
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    what = f" ({short_repr(method)})" if method is not None else ""
    raise _fail(f"'quantization_config'{what} is set: quantized checkpoints are not supported", where)


def check_config_fields(config: dict[str, Any], where: Optional[str] = None) -> None:
    """Types, ranges and finiteness of the config.json keys graphtop reads; CheckpointError otherwise."""
    _not_quantized(config, where)
    for key in _SIZES_REQUIRED:
        _size(config, key, where, required=True)
    for key in _SIZES_OPTIONAL:
        _size(config, key, where, required=False)
    if isinstance(config.get("head_dim"), int) and config["head_dim"] % 2:
        raise _fail(f"'head_dim' must be even (rotary pairs), got {config['head_dim']}", where)
    for key in _FLAGS:
        if config.get(key) is not None and not isinstance(config[key], bool):
            raise _fail(f"'{key}' must be true or false, got {short_repr(config[key])}", where)
    _number(config, "rms_norm_eps", where, above=0.0, at_most=1.0)
    _rope(config, where)
    for key in USED_TOKEN_IDS:
        _token_ids(config, key, where)


def check_spec(spec: ModelSpec, where: Optional[str] = None) -> None:
    """What only holds after transformers filled in defaults (head_dim from hidden / heads, ...)."""
    if spec.head_dim < 2 or spec.head_dim % 2:
        raise _fail(f"head_dim must be an even number >= 2 (rotary pairs), got {spec.head_dim}", where)
    if spec.num_kv_heads > spec.num_heads:
        raise _fail(f"num_key_value_heads={spec.num_kv_heads} is above num_attention_heads={spec.num_heads}", where)
    for name in ("rms_norm_eps", "rope_theta"):
        if not math.isfinite(getattr(spec, name)) or getattr(spec, name) <= 0:
            raise _fail(f"{name} must be a positive finite number, got {getattr(spec, name)!r}", where)


def parameter_count(spec: ModelSpec) -> int:
    """Parameters the family's model will hold for ``spec`` (a tied lm_head counted once): the model without
    layers and one layer of each kind (dense, sparse) built on the meta device (no memory), each counted for
    every layer of its kind. The model's own structure decides, so a family's norms, biases, projections and
    experts are counted as built."""
    cls = model_class(spec)
    kinds = [spec.sparse(i) for i in range(spec.num_layers)]
    total = 0
    with torch.device("meta"):
        total += sum(p.numel() for p in cls(replace(spec, num_layers=0)).parameters())
        for sparse in set(kinds):
            layer = cls.layer_cls(spec, kinds.index(sparse), cls.norm_cls)
            total += kinds.count(sparse) * sum(p.numel() for p in layer.parameters())
    return total


def model_bytes(spec: ModelSpec, dtype: torch.dtype) -> tuple[int, int]:
    """(weights bytes in ``dtype``, rope table bytes incl. the float32 temporaries that build it)."""
    weights = parameter_count(spec) * torch.empty((), dtype=dtype).element_size()
    rope = spec.max_context_len * spec.head_dim * 4 * 2
    return weights, rope


def check_model_fits(
    spec: ModelSpec, dtype: torch.dtype, device: torch.device | str, where: Optional[str] = None
) -> None:
    """Refuse, before allocating, a model whose weights and rope table exceed what ``device`` has."""
    weights, rope = model_bytes(spec, dtype)
    what = (
        f"the model ({parameter_count(spec):,} parameters in {str(dtype).replace('torch.', '')}: weights "
        f"{format_bytes(weights)} + rope table for {spec.max_context_len:,} positions {format_bytes(rope)})"
    )
    problem = fit_problem(what, weights + rope, device)
    if problem:
        raise CheckpointError(located(problem, where))
