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
    their float copy (the sampler upcasts the row it filters)."""
    torch.manual_seed(0)
    logits = torch.randn(3, 1000).to(torch.bfloat16)
    reqs = [_Req(SamplingParams()), _Req(SamplingParams(temperature=0.8, top_k=50, seed=7)),
            _Req(SamplingParams(temperature=1.0, top_p=0.9, seed=3))]
    got = sample(logits, reqs)
    again = sample(logits.float(), [_Req(r.params) for r in reqs])
    assert got == again
    assert got[0] == int(logits[0].float().argmax())
