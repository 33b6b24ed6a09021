"""Random-weight models of published architecture shapes, built straight on the target device.

Benchmarks need real shapes (Qwen3-0.6B, Llama-3.1-8B, SmolLM2-135M, the mixtures of experts Qwen3-30B-A3B and
Mixtral-8x7B) but no weights can be downloaded: the configs below are written from the published numbers, the
weights are seeded noise.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ..loader import LoadedCheckpoint, _materialise
from ..registry import model_class, spec_from_hf_config, stored_at, stored_shapes

SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": dict(
        model_type="qwen3",
        architectures=["Qwen3ForCausalLM"],
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        max_position_embeddings=40960,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        attention_bias=False,
        eos_token_id=151645,
        bos_token_id=151643,
    ),
    "smollm2-135m": dict(
        model_type="llama",
        architectures=["LlamaForCausalLM"],
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        vocab_size=49152,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=False,
        eos_token_id=2,
        bos_token_id=1,
    ),
    "llama-3.1-8b": dict(
        model_type="llama",
        architectures=["LlamaForCausalLM"],
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=128256,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        eos_token_id=128001,
        bos_token_id=128000,
        rope_scaling=dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
        ),
    ),
    "qwen3-30b-a3b": dict(  # 128 experts of 768 features, 8 a token: 3.3B of 30.5B parameters active
        model_type="qwen3_moe",
        architectures=["Qwen3MoeForCausalLM"],
        hidden_size=2048,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_experts=128,
        num_experts_per_tok=8,
        norm_topk_prob=True,
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        vocab_size=151936,
        max_position_embeddings=40960,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        attention_bias=False,
        eos_token_id=151645,
        bos_token_id=151643,
    ),
    "mixtral-8x7b": dict(  # 8 experts of 14336 features, 2 a token
        model_type="mixtral",
        architectures=["MixtralForCausalLM"],
        hidden_size=4096,
        intermediate_size=14336,
        num_local_experts=8,
        num_experts_per_tok=2,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=32000,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        sliding_window=None,
        eos_token_id=2,
        bos_token_id=1,
    ),
}


class IdsTokenizer:
    """Stands in for a tokenizer when prompts are token ids: text is bytes shifted by 3 (ids 0-2 are the
    special ones), and a token decodes to its id in angle brackets, so text streams over HTTP one token
    at a time (``bench/serve_bench.py`` counts arrivals by text) though random weights mean nothing."""

    chat_template = None
    all_special_ids: list[int] = []

    def __init__(self, eos_token_id: int):
        self.eos_token_id = eos_token_id

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [b + 3 for b in text.encode("utf-8")]

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        return "".join(f"<{int(i)}>" for i in ids)


SMALL_VOCAB_IDS = {"bos_token_id": 1, "eos_token_id": 2}
"""The special ids a shape shrunk to a small vocabulary gets where its own ids do not fit (SmolLM2's)."""


def hf_config_for(shape: str, **overrides: Any) -> Any:
    """A published shape's config with ``overrides``. A ``vocab_size`` override keeps the shape's bos/eos
    ids only where they fit the new vocabulary (else ``SMALL_VOCAB_IDS``), so a shrunken shape still
    saves a checkpoint that loads; ids given explicitly outside the vocabulary are refused."""
    from transformers import AutoConfig

    if shape not in SHAPES:
        raise KeyError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    kw = dict(SHAPES[shape])
    vocab = int(overrides.get("vocab_size", kw["vocab_size"]))
    for key, small in SMALL_VOCAB_IDS.items():
        given = overrides.get(key)
        if given is not None and not 0 <= int(given) < vocab:
            raise ValueError(f"{key}={given} is outside the {vocab}-token vocabulary")
        if key not in overrides and kw.get(key) is not None and not 0 <= int(kw[key]) < vocab:
            kw[key] = small
    kw.update(overrides)
    model_type = kw.pop("model_type")
    return AutoConfig.for_model(model_type, **kw)


def _fill_random(name: str, p: torch.Tensor, gen: torch.Generator, std: float) -> None:
    """The one init rule: matrices N(0, std), norm weights 1, biases 0."""
    if p.dim() == 1:
        p.fill_(1.0 if name.endswith("norm.weight") else 0.0)
    else:
        p.normal_(0.0, std, generator=gen)


@torch.no_grad()
def random_checkpoint(
    hf_config: Any, device: str = "cuda", dtype: torch.dtype = torch.bfloat16, seed: int = 0, std: float = 0.02
) -> LoadedCheckpoint:
    spec = spec_from_hf_config(hf_config, "<random>")
    eos = getattr(hf_config, "eos_token_id", None)
    spec = replace(spec, eos_token_ids=(int(eos),) if eos is not None else ())
    model = _materialise(spec, device, dtype)
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in model.named_parameters():
        _fill_random(name, p, gen, std)
    model.eval().requires_grad_(False)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return LoadedCheckpoint(
        model, IdsTokenizer(int(eos or 0)), spec, Path(f"<random {spec.architecture}>"), hf_config, weights
    )


SHARD_BYTES = 4 << 30


@torch.no_grad()
def save_random_checkpoint(
    shape: str,
    folder: str | Path,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    std: float = 0.02,
    device: str = "cpu",
    **overrides: Any,
) -> Path:
    """A random-weight checkpoint folder of a published shape (config.json, sharded safetensors with
    their index, a small local tokenizer), for what needs a checkpoint on disk: a tensor-parallel rank
    loads its slices from the files. Reused when the folder already holds the same one."""
    import json

    from safetensors.torch import save_file

    from .demo_corpus import CORPUS
    from .tokenizer_train import train_byte_level_bpe

    folder = Path(folder)
    stamp = {"shape": shape, "dtype": str(dtype), "seed": seed, "std": std, "overrides": overrides}
    marker = folder / "graphtop-random.json"
    if marker.is_file() and json.loads(marker.read_text()) == stamp:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.safetensors"):
        old.unlink()
    hf_config = hf_config_for(shape, **overrides)
    spec = spec_from_hf_config(hf_config, "<random>")
    with torch.device("meta"):
        names = [(n, tuple(p.shape)) for n, p in model_class(spec)(spec).named_parameters()]
    stored = stored_at(spec)  # the checkpoint's names and layout (a family may stack parameters in one tensor)
    tensors = stored_shapes(spec, dict(names))
    gen = torch.Generator(device=device).manual_seed(seed)
    weight_map: dict[str, str] = {}
    shard: dict[str, torch.Tensor] = {}
    shard_bytes, files = 0, []

    def flush() -> None:
        nonlocal shard, shard_bytes
        name = f"model-{len(files) + 1:05d}.safetensors"
        save_file(shard, str(folder / name), metadata={"format": "pt"})
        files.append(name)
        weight_map.update(dict.fromkeys(shard, name))
        shard, shard_bytes = {}, 0

    for name, shape_ in names:
        t = torch.empty(shape_, dtype=dtype, device=device)
        _fill_random(name, t, gen, std)
        src = stored(name)
        if src.rows is None:
            shard[src.name] = t.cpu()
        else:  # a stacked tensor is saved once all its rows are filled
            whole = shard.setdefault(src.name, torch.empty(tensors[src.name], dtype=dtype))
            whole[src.start : src.stop] = t.cpu()
        shard_bytes += t.numel() * t.element_size()
        if shard_bytes >= SHARD_BYTES and src.stop in (None, src.rows):
            flush()
    if shard:
        flush()
    total = sum(int(torch.Size(s).numel()) * dtype.itemsize for _, s in names)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    hf_config.save_pretrained(str(folder))
    train_byte_level_bpe(CORPUS, vocab_size=512).save_pretrained(str(folder))
    marker.write_text(json.dumps(stamp))
    return folder
