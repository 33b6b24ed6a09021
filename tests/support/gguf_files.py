"""Tiny GGUF files made from a tiny checkpoint folder (a helper module, not a conftest): what
llama.cpp's converter writes, so graphtop's GGUF loader is tested on files of the real layout. Needs the
``gguf`` package (the callers skip without it)."""

from __future__ import annotations

import json

import numpy as np
from safetensors.numpy import load_file

_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def _permute(w, heads):
    """llama.cpp's q/k row order (convert_hf_to_gguf), which transformers undoes when reading."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tensors(folder, config):
    out = {}
    for key, value in load_file(folder / "model.safetensors").items():
        fixed = {
            "model.embed_tokens.weight": "token_embd.weight",
            "model.norm.weight": "output_norm.weight",
            "lm_head.weight": "output.weight",
        }
        if key in fixed:
            out[fixed[key]] = value
            continue
        _, _, layer, *rest = key.split(".")
        module = ".".join(rest[:-1])
        if module == "self_attn.q_proj":
            value = _permute(value, config["num_attention_heads"])
        if module == "self_attn.k_proj":
            value = _permute(value, config["num_key_value_heads"])
        out[f"blk.{layer}.{_NAMES[module]}.weight"] = value
    return out


def build_gguf(folder, path, *, meta=None, edit=None, chat_template=None, eos=None):
    """A float32 llama GGUF of the tiny checkpoint ``folder``; ``meta`` overrides the size keys,
    ``edit(tensors)`` changes the tensors."""
    import gguf

    config = json.loads((folder / "config.json").read_text())
    tok = json.loads((folder / "tokenizer.json").read_text())
    sizes = dict(
        context_length=config["max_position_embeddings"],
        embedding_length=config["hidden_size"],
        block_count=config["num_hidden_layers"],
        feed_forward_length=config["intermediate_size"],
        head_count=config["num_attention_heads"],
        head_count_kv=config["num_key_value_heads"],
    )
    sizes.update(meta or {})
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny")
    for key, value in sizes.items():
        getattr(writer, f"add_{key}")(value)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(10000.0)
    tokens = [t for t, _ in sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * len(tokens))
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
    writer.add_eos_token_id(config["eos_token_id"] if eos is None else eos)
    if chat_template:
        writer.add_chat_template(chat_template)
    tensors = _tensors(folder, config)
    if edit:
        edit(tensors)
    for name, value in tensors.items():  # uint8: Q8_0 blocks (gguf.quants.quantize)
        raw = gguf.GGMLQuantizationType.Q8_0 if value.dtype == np.uint8 else None
        writer.add_tensor(name, np.ascontiguousarray(value), raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _family_tensors(folder, config, arch):
    """The checkpoint's tensors under llama.cpp's names (gguf-py's map), as its converter writes them for
    Gemma and Phi-3: Gemma's norms stored as 1 + w, Phi-3's stacked tensors as they are."""
    import gguf

    names = gguf.get_tensor_name_map(arch, config["num_hidden_layers"])
    out = {}
    for key, value in load_file(folder / "model.safetensors").items():
        module, _, kind = key.rpartition(".")
        if arch in (gguf.MODEL_ARCH.GEMMA2, gguf.MODEL_ARCH.GEMMA3) and key.endswith("norm.weight"):
            value = value + 1
        out[f"{names.get_name(module)}.{kind}"] = value
    return out


def build_family_gguf(folder, path, arch_name, *, long_factors=None):
    """A float32 GGUF of the tiny Gemma 2 / Gemma 3 / Phi-3 checkpoint ``folder`` (``arch_name``: llama.cpp's,
    "gemma2", "gemma3", "phi3"), with the metadata llama.cpp's converter writes for the family;
    ``long_factors``: Phi-3's LongRoPE (short, long, original context, attention factor), stored as llama.cpp
    stores it (two tensors and two keys)."""
    import gguf

    arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch_name)
    config = json.loads((folder / "config.json").read_text())
    tok = json.loads((folder / "tokenizer.json").read_text())
    writer = gguf.GGUFWriter(str(path), arch_name)
    writer.add_name("tiny")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    rope = config.get("rope_parameters") or {}
    if arch_name.startswith("gemma"):
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
        writer.add_sliding_window(config["sliding_window"])
        writer.add_rope_freq_base((rope.get("full_attention") or rope).get("rope_theta", 10000.0))
    full = rope.get("full_attention") or {}
    if arch_name == "gemma3" and full.get("rope_type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(full["factor"])
    if arch_name == "gemma2":
        writer.add_attn_logit_softcapping(config["attn_logit_softcapping"])
        writer.add_final_logit_softcapping(config["final_logit_softcapping"])
    if arch_name == "phi3":
        writer.add_rope_freq_base(rope.get("rope_theta", 10000.0))
        writer.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 1.0)))
        if config.get("sliding_window"):
            writer.add_sliding_window(config["sliding_window"])
    tensors = _family_tensors(folder, config, arch)
    if long_factors is not None:
        short, long, original, attn_factor = long_factors
        writer.add_rope_scaling_orig_ctx_len(original)
        writer.add_rope_scaling_attn_factors(attn_factor)
        tensors["rope_factors_short.weight"] = np.asarray(short, dtype=np.float32)
        tensors["rope_factors_long.weight"] = np.asarray(long, dtype=np.float32)
    tokens = [t for t, _ in sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * len(tokens))
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_pad_token_id(config["eos_token_id"])
    for name, value in tensors.items():
        writer.add_tensor(name, np.ascontiguousarray(value))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
