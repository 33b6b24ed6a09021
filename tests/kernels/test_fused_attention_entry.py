"""The fused attention entry (``forward_qkv``) contract, on CPU: a backend that takes the fused q|k|v
projection gets it (with the RoPE cache and q/k-norm weights) and its output is the layer's attention;
backends without such a kernel decline with None; the PDL policy never turns on off-GPU."""

from __future__ import annotations

import pytest
import torch

from graphtop.engine.attention.base import AttentionShape
from graphtop.engine.attention.torch_native import TorchNativeBackend
from graphtop.engine.kv_pool import KVLayout, KVPool
from graphtop.models.decoder import Attention
from graphtop.models.kernels import fused as tk
from graphtop.models.kernels.qkv_input import QKVInput
from graphtop.models.layers.rope import RotaryEmbedding
from graphtop.models.spec import ModelSpec


def _spec(qk_norm: bool) -> ModelSpec:
    from types import SimpleNamespace

    from graphtop.models.registry import spec_from_hf_config

    cfg = SimpleNamespace(
        architectures=["Qwen3ForCausalLM" if qk_norm else "LlamaForCausalLM"],
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=32,
        vocab_size=100,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        hidden_act="silu",
        tie_word_embeddings=False,
    )
    return spec_from_hf_config(cfg)


class FusedAttn:
    """An ``attn`` with a fused entry: records what it was given and returns a marker output."""

    def __init__(self, answer: bool) -> None:
        self.answer, self.calls, self.plain_calls = answer, [], 0

    def __call__(self, q, k, v, layer_id):  # the unfused entry
        self.plain_calls += 1
        return q

    def forward_qkv(self, x, layer_id):
        self.calls.append((*x, layer_id))
        if not self.answer:
            return None
        return torch.full((x.qkv.shape[0], 4, 16), 7.0)


@pytest.mark.parametrize("qk_norm", [True, False])
def test_fused_entry_gets_the_projection_and_its_output_is_the_attention(qk_norm):
    spec = _spec(qk_norm)
    assert spec.qk_norm == qk_norm
    att = Attention(spec, layer_id=0)
    att.fuse()
    rope = RotaryEmbedding(spec)
    qkv = torch.randn(3, (4 + 2 * 2) * 16)
    pos = torch.tensor([0, 5, 9])
    attn = FusedAttn(answer=True)
    out = att.attend_fused(qkv, pos, rope, attn)
    assert out.shape == (3, 64) and bool((out == 7.0).all())
    assert attn.plain_calls == 0
    ((got_qkv, got_pos, cache, qw, kw, eps, layer),) = attn.calls
    assert got_qkv is qkv and got_pos is pos and cache is rope.cos_sin_cache and layer == 0
    if qk_norm:
        assert qw is att.q_norm.weight and kw is att.k_norm.weight and eps == att.q_norm.eps
    else:
        assert qw is None and kw is None


def test_backends_without_a_fused_kernel_decline_and_calling_them_is_forward():
    pool = KVPool(KVLayout(1, 2, 16, torch.float32), 8, 1, "cpu")
    backend = TorchNativeBackend(pool, AttentionShape(4, 2, 16, 0.25), torch.device("cpu"))
    assert (
        backend.forward_qkv(QKVInput(torch.zeros(1, 128), torch.zeros(1, dtype=torch.long), torch.zeros(4, 16)), 0)
        is None
    )
    seen = []
    backend.forward = lambda q, k, v, layer_id: seen.append(layer_id) or q
    q = torch.zeros(1, 4, 16)
    assert backend(q, q, q, 3) is q and seen == [3]


def test_pdl_policy():
    cpu = torch.device("cpu")
    for policy in ("auto", "on", "off"):
        assert tk.use_pdl(cpu, 0, policy) is False  # never off-GPU
