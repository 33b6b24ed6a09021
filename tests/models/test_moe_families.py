"""Qwen3-MoE and Mixtral against transformers on tiny random fp32 checkpoints: logits of every position,
prefill and decode one token at a time; each family's routing rule against transformers' own router; what
each family reads from its config, and the expert weights held once."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from support.tiny_models import build_tiny_checkpoint

from graphtop.models import CheckpointError, load_checkpoint
from graphtop.models.checkpoint.config_check import parameter_count
from graphtop.models.layers.moe import SparseMoE, expert_banks, expert_weight_bytes
from graphtop.models.layers.moe_routing import Routing, route
from graphtop.models.layers.reference_attention import ContiguousAttention

CASES = {
    "qwen3-moe": ("qwen3_moe", {}),
    # weights not renormalised; layer 1 dense (mlp_only_layers), its MLP of intermediate_size
    "qwen3-moe-unnormalised-dense-layer": ("qwen3_moe", {"norm_topk_prob": False, "mlp_only_layers": [1]}),
    "qwen3-moe-window-top1": (
        "qwen3_moe",
        {"use_sliding_window": True, "sliding_window": 16, "num_experts_per_tok": 1},
    ),
    "mixtral": ("mixtral", {}),
    "mixtral-window-tied": ("mixtral", {"sliding_window": 16, "tie_word_embeddings": True}),
}
LENGTHS = (1, 9, 17, 60)


def hf_model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def forward(model, ids, attn, start=0):
    with torch.no_grad():
        return model.compute_logits(model(ids, torch.arange(start, start + len(ids)), attn))


@pytest.mark.parametrize("case", CASES)
def test_logits_match_transformers_prefill_and_decode(tmp_path, case, torch_one_thread):
    family, overrides = CASES[case]
    path = build_tiny_checkpoint(tmp_path, family, **overrides)
    loaded = load_checkpoint(path)
    model, spec = loaded.model, loaded.spec
    ids = torch.randint(0, spec.vocab_size, (max(LENGTHS),), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf_model(path)(ids[None]).logits[0]
    for n in LENGTHS:
        got = forward(model, ids[:n], ContiguousAttention.for_spec(spec))
        torch.testing.assert_close(got, want[:n], atol=1e-5, rtol=1e-5)
    attn = ContiguousAttention.for_spec(spec)
    rows = [forward(model, ids[:20], attn)[-1]]  # prefill, then a token at a time
    rows += [forward(model, ids[p : p + 1], attn, start=p)[0] for p in range(20, max(LENGTHS))]
    torch.testing.assert_close(torch.stack(rows), want[19:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_routing_equals_transformers_router(family, dtype):
    """Same experts, same weights to the bit, in the dtype each family keeps them in."""
    from transformers import MixtralConfig, Qwen3MoeConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    gen = torch.Generator().manual_seed(3)
    for renormalize in [True, False] if family == "qwen3_moe" else [True]:
        if family == "qwen3_moe":
            config = Qwen3MoeConfig(hidden_size=32, num_experts=16, num_experts_per_tok=4, norm_topk_prob=renormalize)
            hf = Qwen3MoeTopKRouter(config)
        else:
            hf = MixtralTopKRouter(MixtralConfig(hidden_size=32, num_local_experts=16, num_experts_per_tok=4))
        hf = hf.to(dtype)
        with torch.no_grad():
            hf.weight.copy_(torch.randn(hf.weight.shape, generator=gen))
            x = torch.randn(50, 32, generator=gen).to(dtype)
            _, want_w, want_ids = hf(x)
            rule = Routing(4, renormalize, weights_fp32=family == "mixtral")
            got_w, got_ids = route(torch.nn.functional.linear(x, hf.weight), rule)
        assert torch.equal(got_ids, want_ids)
        assert got_w.dtype == want_w.dtype and torch.equal(got_w, want_w)


def test_what_each_family_reads(tmp_path):
    qwen = load_checkpoint(build_tiny_checkpoint(tmp_path / "q", "qwen3_moe", mlp_only_layers=[0])).spec
    assert (qwen.num_experts, qwen.num_experts_per_tok, qwen.moe_intermediate_size) == (8, 2, 32)
    assert qwen.norm_topk_prob and qwen.qk_norm and qwen.moe_layers == (1,)
    mixtral = load_checkpoint(build_tiny_checkpoint(tmp_path / "m", "mixtral", sliding_window=16)).spec
    assert (mixtral.num_experts, mixtral.num_experts_per_tok, mixtral.moe_intermediate_size) == (4, 2, 48)
    assert mixtral.norm_topk_prob and mixtral.moe_layers == (0, 1) and mixtral.layer_windows() == (16, 16)


def test_experts_are_held_once_as_views_of_their_stacked_weights(tmp_path):
    """Each expert's parameters are rows of its layer's ``w13`` / ``w2`` (what the grouped paths read), so
    the expert weights count once in the weights' bytes, which the parameter count predicted."""
    loaded = load_checkpoint(build_tiny_checkpoint(tmp_path, "qwen3_moe", mlp_only_layers=[1]))
    model, spec = loaded.model, loaded.spec
    (bank,) = expert_banks(model)
    w13, w2 = bank.weights()
    i = spec.moe_intermediate_size
    for e, expert in enumerate(bank):
        gate, up, down = (p.weight for p in expert.projections())
        assert gate.data_ptr() == w13[e].data_ptr() and up.data_ptr() == w13[e, i:].data_ptr()
        assert down.data_ptr() == w2[e].data_ptr()
    assert expert_weight_bytes(model) == (w13.numel() + w2.numel()) * 4
    assert loaded.weights_bytes == parameter_count(spec) * 4
    assert isinstance(model.model.layers[0].mlp, SparseMoE) and not isinstance(model.model.layers[1].mlp, SparseMoE)
    # the fused dense kernels step aside (the experts take the grouped GEMM on CUDA): no packed weight copies
    assert "MoELayer" in model.fused_kernels_problem() and model.packed_copy_bytes() == 0


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"num_experts_per_tok": 9}, r"'num_experts_per_tok' \(9\) is above 'num_experts' \(8\)"),
        ({"moe_intermediate_size": 0}, r"'moe_intermediate_size' must be a positive integer, got 0"),
    ],
)
def test_a_router_that_cannot_route_is_refused_in_one_line(tmp_path, edit, message):
    path = build_tiny_checkpoint(tmp_path, "qwen3_moe")
    config = json.loads((path / "config.json").read_text())
    config.update(edit)
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message) as err:
        load_checkpoint(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)
