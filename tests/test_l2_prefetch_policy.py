"""Which projections ask their weights into L2 before the PDL wait, and when a share can be asked for
(models/l2_prefetch.py; the kernels themselves: tests/test_cuda_l2_prefetch.py)."""

from __future__ import annotations

import torch

from graphtop.models import l2_prefetch as l2p


def test_flags_follow_the_projection_set_in_decoder_order(monkeypatch):
    monkeypatch.setattr(l2p, "PROJECTIONS", frozenset({"o", "down"}))
    assert l2p.flags() == (False, True, False, True)
    assert l2p.NAMES == ("qkv", "o", "gate_up", "down")


def test_each_decoder_layer_takes_the_switches_when_its_launch_policy_is_set(monkeypatch):
    from graphtop.models.random_model import hf_config_for, random_checkpoint

    model = random_checkpoint(hf_config_for("qwen3-0.6b", num_hidden_layers=2, hidden_size=64,
                                            intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
                                            head_dim=32, vocab_size=256),
                              device="cpu", dtype=torch.float32).model
    layers = model.model.layers
    assert all(layer.l2_prefetch == (False,) * 4 for layer in layers)
    monkeypatch.setattr(l2p, "PROJECTIONS", frozenset({"o"}))
    for layer in layers:  # the fused projections, as enable_fused_kernels leaves them (CPU: no kernels)
        layer.self_attn.fuse()
        layer.mlp.fuse()
        layer.set_pdl("auto")
    assert all(layer.l2_prefetch == (False, True, False, False) for layer in layers)


def test_a_share_is_asked_for_only_in_whole_aligned_16_byte_units():
    w = torch.empty(64, 64, dtype=torch.bfloat16)
    assert l2p.fits(w, 64) and l2p.fits(w, 8)  # 128 and 16 bytes a row share
    assert not l2p.fits(w, 4)  # 8 bytes
    assert not l2p.fits(w.view(-1)[1:], 8)  # starts 2 bytes past an aligned address
