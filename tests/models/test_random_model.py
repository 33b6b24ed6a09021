"""The random-weight shapes the benchmarks and GPU tests build: a shrunken vocabulary keeps special ids
that fit it, so what a bench saves loads again (config.json's token ids are validated at load)."""

from __future__ import annotations

import pytest
import torch

from graphtop.models.loader import load_checkpoint
from graphtop.models.synthetic.random_model import SHAPES, SMALL_VOCAB_IDS, hf_config_for, save_random_checkpoint

SMALL = dict(
    num_hidden_layers=1,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
)


@pytest.mark.parametrize("shape", ["qwen3-0.6b", "llama-3.1-8b"])
def test_a_shrunken_vocabulary_gets_ids_inside_it(shape):
    cfg = hf_config_for(shape, vocab_size=300)
    assert (cfg.bos_token_id, cfg.eos_token_id) == tuple(SMALL_VOCAB_IDS.values())
    assert SHAPES[shape]["eos_token_id"] >= 300  # the shape's own id would not have fit


def test_the_shapes_own_ids_stay_where_they_fit():
    cfg = hf_config_for("llama-3.1-8b", vocab_size=128002)
    assert (cfg.bos_token_id, cfg.eos_token_id) == (128000, 128001)
    full = hf_config_for("qwen3-0.6b")
    assert (full.bos_token_id, full.eos_token_id) == (151643, 151645)


def test_explicit_ids_are_kept_or_refused():
    cfg = hf_config_for("qwen3-0.6b", vocab_size=300, bos_token_id=7, eos_token_id=9)
    assert (cfg.bos_token_id, cfg.eos_token_id) == (7, 9)
    with pytest.raises(ValueError, match=r"^eos_token_id=300 is outside the 300-token vocabulary$"):
        hf_config_for("qwen3-0.6b", vocab_size=300, eos_token_id=300)
    with pytest.raises(ValueError, match="bos_token_id=-1"):
        hf_config_for("llama-3.1-8b", vocab_size=300, bos_token_id=-1)


def test_a_saved_shrunken_shape_loads(tmp_path, torch_one_thread):
    path = save_random_checkpoint("qwen3-0.6b", tmp_path / "rand", dtype=torch.float32, vocab_size=300, **SMALL)
    ckpt = load_checkpoint(path)
    assert ckpt.spec.vocab_size == 300 and SMALL_VOCAB_IDS["eos_token_id"] in ckpt.spec.eos_token_ids


@pytest.mark.parametrize(
    "shape, experts", [("qwen3-30b-a3b", dict(num_experts=4, moe_intermediate_size=32)), ("mixtral-8x7b", {})]
)
def test_a_saved_shrunken_mixture_of_experts_loads(tmp_path, torch_one_thread, shape, experts):
    """The MoE shapes (their routing kept, experts shrunk) save per-expert tensors that load."""
    small = {**SMALL, "num_experts_per_tok": 2, **experts}
    if shape == "mixtral-8x7b":
        small.update(num_local_experts=4)
    path = save_random_checkpoint(shape, tmp_path / "rand", dtype=torch.float32, vocab_size=300, **small)
    spec = load_checkpoint(path).spec
    assert (spec.num_experts, spec.num_experts_per_tok, spec.moe_layers) == (4, 2, (0,))
    assert spec.architecture == SHAPES[shape]["architectures"][0]
