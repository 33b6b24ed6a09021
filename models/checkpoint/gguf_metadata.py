"""What transformers' GGUF reader leaves out of a Gemma or Phi-3 config, read back from the file as llama.cpp
wrote it (or as llama.cpp derives it), so a converted folder serves the model the file holds.

transformers maps llama.cpp's metadata keys per architecture (its ``GGUF_CONFIG_MAPPING``), and for these
families some are missing: it would keep its config class's defaults, a model that loads and answers with
other logits. Restored here:

* Gemma 2: the attention and output logits' soft caps (``{arch}.attn_logit_softcapping``,
  ``{arch}.final_logit_softcapping``);
* Gemma 2 and 3: the query scale, which llama.cpp does not store but derives: head_dim ** -0.5, except for the
  27B models (46 and 62 layers), hidden_size / heads;
* Gemma 3: the global layers' linear RoPE scaling (``{arch}.rope.scaling.type``, ``.factor``); the local
  layers' base (10000) and the local/global pattern (five in six) are llama.cpp's fixed values and
  transformers' defaults alike;
* Phi-3: the rotated share of each head (``{arch}.rope.dimension_count``), the sliding window, and LongRoPE,
  whose factors llama.cpp stores as the tensors ``rope_factors_short``/``rope_factors_long`` beside
  ``{arch}.rope.scaling.original_context_length`` and ``.attn_factor``.
"""

from __future__ import annotations

from typing import Any, Optional

_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def _field(reader: Any, key: str) -> Optional[Any]:
    """A metadata value of the file (a number, a string), or None where absent."""
    field = reader.fields.get(key)
    if field is None or not field.data:
        return None
    value = field.contents()
    return value.item() if hasattr(value, "item") else value


def _tensor(reader: Any, name: str) -> Optional[list[float]]:
    found = [t for t in reader.tensors if t.name == name]
    return [float(x) for x in found[0].data.reshape(-1)] if found else None


def _set_rope(config: Any, params: dict[str, Any]) -> None:
    """Merge ``params`` into the config's rope dict (transformers 5: ``rope_parameters``)."""
    config.rope_parameters = {**(getattr(config, "rope_parameters", None) or {}), **params}


def restore_metadata(reader: Any, config: Any) -> None:
    """Set on ``config`` (transformers' config of the file) what its reader left out for the file's family."""
    arch = _field(reader, "general.architecture")
    if arch in _GEMMA_27B_LAYERS:
        heads = int(config.num_attention_heads)
        big = int(config.num_hidden_layers) == _GEMMA_27B_LAYERS[arch]
        config.query_pre_attn_scalar = int(config.hidden_size) // heads if big else int(config.head_dim)
    if arch == "gemma2":
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            value = _field(reader, f"{arch}.{key}")
            if value is not None:
                setattr(config, key, float(value))
    if arch == "gemma3" and _field(reader, f"{arch}.rope.scaling.type") == "linear":
        factor = _field(reader, f"{arch}.rope.scaling.factor")
        rope = dict(getattr(config, "rope_parameters", None) or {})
        rope["full_attention"] = {**rope.get("full_attention", {}), "rope_type": "linear", "factor": float(factor)}
        config.rope_parameters = rope
    if arch == "phi3":
        _restore_phi3(reader, config, arch)


def _restore_phi3(reader: Any, config: Any, arch: str) -> None:
    head_dim = int(config.hidden_size) // int(config.num_attention_heads)
    rotated = _field(reader, f"{arch}.rope.dimension_count")
    if rotated is not None and int(rotated) != head_dim:
        _set_rope(config, {"partial_rotary_factor": int(rotated) / head_dim})
    window = _field(reader, f"{arch}.attention.sliding_window")
    if window is not None:
        config.sliding_window = int(window)
    short, long = _tensor(reader, "rope_factors_short.weight"), _tensor(reader, "rope_factors_long.weight")
    original = _field(reader, f"{arch}.rope.scaling.original_context_length")
    if short is None or long is None or original is None:
        return
    config.original_max_position_embeddings = int(original)
    params = {"rope_type": "longrope", "short_factor": short, "long_factor": long}
    params["original_max_position_embeddings"] = int(original)
    attention = _field(reader, f"{arch}.rope.scaling.attn_factor")
    if attention is not None:
        params["attention_factor"] = float(attention)
    _set_rope(config, params)
