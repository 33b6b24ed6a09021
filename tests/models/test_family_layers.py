"""The family contract: the registry lists one family per architecture, a family's activation is honoured by
the torch layers (the fused kernels, SiLU-only, step aside and say so), and checkpoints load through each
family's weight mapping."""

from __future__ import annotations

import logging
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from support.tiny_models import build_tiny_checkpoint

import graphtop.models.decoder as decoder_mod
from graphtop.models import load_checkpoint
from graphtop.models.layers.reference_attention import ContiguousAttention
from graphtop.models.registry import ARCHITECTURES, FAMILIES, SUPPORTED_ARCHITECTURES, stored_at, stored_shapes


def test_registry_lists_each_family_once():
    assert len({f.architecture for f in FAMILIES}) == len(FAMILIES) == len(ARCHITECTURES)
    assert len({f.model_type for f in FAMILIES}) == len(FAMILIES)
    assert SUPPORTED_ARCHITECTURES == tuple(f.architecture for f in FAMILIES)


@pytest.mark.parametrize("act", ["gelu", "gelu_pytorch_tanh"])
def test_another_activation_runs_on_the_torch_layers_like_transformers(tmp_path, act):
    from transformers import AutoModelForCausalLM

    path = build_tiny_checkpoint(tmp_path, "llama", hidden_act=act)
    loaded = load_checkpoint(path)
    assert loaded.spec.hidden_act == act
    ids = torch.randint(0, loaded.spec.vocab_size, (40,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()(ids[None]).logits[0]
        got = loaded.model.compute_logits(loaded.model(ids, torch.arange(len(ids)), ContiguousAttention()))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_fused_kernels_step_aside_for_what_they_do_not_implement(tmp_path, monkeypatch, caplog):
    """Where the fused kernels would run (CUDA bf16), a model they cannot run stays on the torch layers and a
    warning says why; a SiLU model has no such problem."""
    silu = load_checkpoint(build_tiny_checkpoint(tmp_path / "silu", "llama")).model
    gelu = load_checkpoint(build_tiny_checkpoint(tmp_path / "gelu", "llama", hidden_act="gelu")).model
    assert silu.fused_kernels_problem() is None
    assert "hidden_act 'gelu'" in gelu.fused_kernels_problem()
    monkeypatch.setattr(decoder_mod, "fused_kernels_run", lambda weight: True)
    with caplog.at_level(logging.WARNING, logger=decoder_mod.__name__):
        assert gelu.enable_fused_kernels() is False
    assert not gelu.fused_kernels and hasattr(gelu.model.layers[0].mlp, "gate_proj")  # nothing was fused
    assert "runs on the torch layers" in caplog.text and "hidden_act 'gelu'" in caplog.text


def test_default_families_store_every_parameter_under_its_own_name(tmp_path):
    loaded = load_checkpoint(build_tiny_checkpoint(tmp_path, "qwen3"))
    params = {n: tuple(p.shape) for n, p in loaded.model.named_parameters()}
    assert all(stored_at(loaded.spec)(n).name == n for n in params)
    assert stored_shapes(loaded.spec, params) == params
