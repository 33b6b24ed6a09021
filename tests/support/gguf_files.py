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
