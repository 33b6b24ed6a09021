"""Logits stay in the model's dtype: the lm_head writes them (into a graph's output buffer when given
one), and greedy sampling takes the argmax of those, which is the argmax of their float copy."""

from __future__ import annotations

import pytest
import torch

from graphtop.engine.sampler import sample
from graphtop.engine.sampling_params import SamplingParams
from graphtop.models import load_checkpoint


@pytest.mark.parametrize("family,tied", [("llama", False), ("qwen3", True)])
def test_compute_logits_model_dtype_and_in_place(tiny_ckpt, family, tied):
    model = load_checkpoint(tiny_ckpt(family, tie_word_embeddings=tied), dtype=torch.bfloat16).model
    hidden = torch.randn(5, model.spec.hidden_size, dtype=torch.bfloat16)
    with torch.inference_mode():
        logits = model.compute_logits(hidden)
        buf = torch.full((8, model.spec.vocab_size), float("nan"), dtype=torch.bfloat16)
        got = model.compute_logits(hidden, out=buf[:5])
    assert logits.dtype == torch.bfloat16 and logits.shape == (5, model.spec.vocab_size)
    assert got.data_ptr() == buf.data_ptr()  # written in place, no copy
    assert torch.equal(got, logits) and torch.equal(logits, model.lm_head(hidden))
    assert torch.isnan(buf[5:]).all()  # rows past the slice untouched
    assert torch.equal(logits.argmax(-1), logits.float().argmax(-1))


class _Req:
    def __init__(self, params: SamplingParams) -> None:
        self.params, self.generator = params, None


def test_sample_takes_model_dtype_logits():
    """Greedy rows pick the bf16 argmax; seeded rows sample the same token from bf16 logits as from
    their float copy (the sampler upcasts the rows it samples)."""
    torch.manual_seed(0)
    logits = torch.randn(3, 1000).to(torch.bfloat16)
    reqs = [
        _Req(SamplingParams()),
        _Req(SamplingParams(temperature=0.8, top_k=50, seed=7)),
        _Req(SamplingParams(temperature=1.0, top_p=0.9, seed=3)),
    ]
    got = sample(logits, reqs)
    again = sample(logits.float(), [_Req(r.params) for r in reqs])
    assert got == again
    assert got[0] == int(logits[0].float().argmax())


@pytest.mark.parametrize("family,tied", [("llama", False), ("qwen3", True)])
def test_final_norm_folds_into_an_untied_lm_head_only(tiny_ckpt, family, tied):
    """The fused path folds the final RMSNorm's weight into an untied lm_head (so a skinny lm_head can
    normalise by a per-row scale): the norm's weight becomes ones and the logits stay the same up to
    the fold's rounding. A tied head is also the embedding table: nothing moves."""
    from graphtop.models.layers.norm import PreNorm

    model = load_checkpoint(tiny_ckpt(family, tie_word_embeddings=tied), dtype=torch.float32).model
    norm_weight = model.model.norm.weight.detach().clone()
    assert not bool((norm_weight == 1).all())  # the tiny checkpoints draw non-trivial norms
    hidden = torch.randn(5, model.spec.hidden_size)
    with torch.inference_mode():
        before = model.compute_logits(model.model.final_norm(PreNorm(hidden)))
    head = model.lm_head.weight.detach().clone()
    model._fold_final_norm()
    with torch.inference_mode():
        after = model.compute_logits(model.model.final_norm(PreNorm(hidden)))
    if tied:
        assert torch.equal(model.model.norm.weight, norm_weight) and torch.equal(model.lm_head.weight, head)
        assert torch.equal(after, before)
    else:
        assert bool((model.model.norm.weight == 1).all())
        assert torch.allclose(model.lm_head.weight, head * norm_weight[None, :])
        assert torch.allclose(after, before, rtol=1e-4, atol=1e-5)
