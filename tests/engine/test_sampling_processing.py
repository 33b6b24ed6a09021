"""The sampler's logit processing: repetition, presence and frequency penalties, logit bias and the
min_tokens mask match per-row references (transformers' repetition penalty among them), batched with rows
that ask for nothing; neutral values keep the fast path and its tokens; and the engine ends requests on
stop token ids, holds back their text, and honours min_tokens, in graph and eager steps alike."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import math

import pytest
import torch
from support.engine_prompts import PROMPTS
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from graphtop.engine.penalties import process_rows
from graphtop.engine.request import FinishReason
from graphtop.engine.sampler import sample
from graphtop.engine.sampling_params import SamplingParamError, SamplingParams

pytestmark = pytest.mark.usefixtures("torch_one_thread")
VOCAB = 50


class _Req:
    def __init__(self, params: SamplingParams, prompt: list[int], output: list[int]) -> None:
        self.params, self.prompt_ids, self.output_ids = params, prompt, output
        self.generator = self.prompt_vocab = None


def _reference(row: torch.Tensor, req: _Req, eos: frozenset[int]) -> torch.Tensor:
    """One row the straightforward way: bias, min_tokens mask, then transformers' repetition penalty over
    prompt + output, then OpenAI's frequency and presence penalties over the output."""
    p, row = req.params, row.clone()
    for token, bias in p.logit_bias:
        row[token] += bias
    if len(req.output_ids) < p.min_tokens:
        for token in set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos)):
            row[token] = -math.inf
    if p.repetition_penalty != 1.0:
        ids = torch.tensor([req.prompt_ids + req.output_ids])
        row = RepetitionPenaltyLogitsProcessor(p.repetition_penalty)(ids, row[None])[0]
    for token in set(req.output_ids):
        row[token] -= p.frequency_penalty * req.output_ids.count(token) + p.presence_penalty
    return row


def test_processing_matches_per_row_references_batched_with_plain_rows() -> None:
    g = torch.Generator().manual_seed(0)
    eos = frozenset({0})
    params = [
        SamplingParams(repetition_penalty=1.3),
        SamplingParams(repetition_penalty=0.7, frequency_penalty=0.5, presence_penalty=-0.4),
        SamplingParams(logit_bias={"7": 5.5, 9: -100}),
        SamplingParams(min_tokens=4, stop_token_ids=[3, 4], max_new_tokens=8),
        SamplingParams(min_tokens=4, ignore_eos=True, stop_token_ids=[5], max_new_tokens=8),
        SamplingParams(frequency_penalty=2.0, presence_penalty=2.0, logit_bias={1: 3.0}, min_tokens=2),
    ]
    reqs = []
    for i, p in enumerate(params):
        prompt = torch.randint(VOCAB, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g).tolist()
        reqs.append(_Req(p, prompt, torch.randint(VOCAB, (i,), generator=g).tolist()))
    logits = torch.randn(len(reqs), VOCAB, generator=g) * 3
    got = process_rows(logits.clone(), reqs, eos)
    want = torch.stack([_reference(row, r, eos) for row, r in zip(logits, reqs)])
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-6, equal_nan=False)
    assert torch.equal(torch.isinf(got), torch.isinf(want))


def test_processed_greedy_rows_take_the_processed_argmax_and_plain_rows_the_raw_one() -> None:
    logits = torch.tensor([[0.0, 5.0, 1.0, 2.0]] * 3)
    reqs = [
        _Req(SamplingParams(), [1], []),
        _Req(SamplingParams(logit_bias={2: 10.0}), [1], []),
        _Req(SamplingParams(repetition_penalty=10.0), [1], []),  # 5 / 10 < 2
    ]
    assert sample(logits, reqs) == [1, 2, 3]


def test_neutral_values_are_plain_and_change_nothing() -> None:
    neutral = SamplingParams(
        repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0, logit_bias={}, min_tokens=0, min_p=0.0
    )
    assert neutral.plain and neutral == SamplingParams()
    assert SamplingParams(logit_bias={3: 0}).plain  # a zero bias asks for nothing
    assert SamplingParams(min_tokens=4, ignore_eos=True, max_new_tokens=8).plain  # nothing for it to hold back
    assert not SamplingParams(min_tokens=4, max_new_tokens=8).plain
    assert not SamplingParams(logprobs=0).plain and not SamplingParams(temperature=0.5).plain


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(presence_penalty=2.5), "presence_penalty"),
        (dict(frequency_penalty=float("nan")), "frequency_penalty"),
        (dict(min_p=1.5), "min_p"),
        (dict(logit_bias={"x": 1}), "logit_bias"),
        (dict(logit_bias={1: 101}), "logit_bias"),
        (dict(stop_token_ids=[-1]), "stop_token_ids"),
        (dict(min_tokens=-1), "min_tokens"),
        (dict(logprobs=21), "logprobs"),
        (dict(prompt_logprobs=True), "prompt_logprobs"),
        (dict(skip_special_tokens="no"), "skip_special_tokens"),
    ],
)
def test_bad_values_name_their_field(kwargs, field) -> None:
    with pytest.raises(SamplingParamError) as info:
        SamplingParams(**kwargs)
    assert info.value.field == field and str(info.value).startswith(field)


def test_min_p_keeps_only_tokens_near_the_most_likely() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    req = _Req(SamplingParams(temperature=1.0, min_p=0.5), [1], [])
    assert {sample(logits, [req])[0] for _ in range(300)} == {0, 1}  # 0.15 < 0.5 * 0.5


@pytest.fixture(scope="module")
def llama(tiny_ckpt):
    return tiny_ckpt("llama")


@pytest.mark.parametrize("graphs", [None, False], ids=["emulated-graphs", "eager"])
def test_penalised_requests_decode_in_graphs_beside_plain_ones(llama, make_engine, graphs) -> None:
    engine = make_engine(llama, graphs=graphs)
    plain = SamplingParams(max_new_tokens=12, ignore_eos=True)
    neutral = plain.replace(repetition_penalty=1.0, presence_penalty=0.0, logit_bias={5: 0.0})
    pushed = plain.replace(logit_bias={123: 100.0})
    want = [h.token_ids for h in engine.generate(PROMPTS[:3], plain)]
    got = [h.token_ids for h in engine.generate(PROMPTS[:3], neutral)]
    assert got == want  # neutral values: the same greedy tokens, bit for bit
    overlapped = engine.overlapped_steps
    handles = [engine.submit(p, plain) for p in PROMPTS[:3]] + [engine.submit(PROMPTS[3], pushed)]
    engine.run_until_idle()
    assert [h.token_ids for h in handles[:3]] == want
    assert handles[3].token_ids == [123] * 12
    if graphs is None:
        assert engine.loop.overlapped_steps == overlapped  # a processed row needs the sampler, not the overlap
        assert engine.pool.used_pages == 0


def test_stop_token_ids_end_the_request_and_their_text_is_hidden(llama, make_engine) -> None:
    engine = make_engine(llama)
    free = engine.generate([PROMPTS[0]], SamplingParams(max_new_tokens=10, ignore_eos=True))[0]
    stop = free.token_ids[4]
    first = free.token_ids.index(stop)
    (hidden,) = engine.generate([PROMPTS[0]], SamplingParams(max_new_tokens=10, stop_token_ids=[stop]))
    (shown,) = engine.generate(
        [PROMPTS[0]], SamplingParams(max_new_tokens=10, stop_token_ids=[stop], include_stop_str_in_output=True)
    )
    assert hidden.finish_reason is FinishReason.STOP and hidden.token_ids == free.token_ids[: first + 1]
    tok = engine.tokenizer
    assert hidden.text == tok.decode(free.token_ids[:first], skip_special_tokens=True)
    assert shown.text == tok.decode(free.token_ids[: first + 1], skip_special_tokens=True)
    (late,) = engine.generate(
        [PROMPTS[0]], SamplingParams(max_new_tokens=10, stop_token_ids=[stop], min_tokens=first + 2)
    )
    assert len(late.token_ids) >= first + 2 and stop not in late.token_ids[: first + 2]


def test_min_tokens_holds_back_the_end_of_sequence(llama, make_engine) -> None:
    engine = make_engine(llama)
    eos = engine.tokenizer.eos_token_id
    towards_eos = SamplingParams(max_new_tokens=20, logit_bias={eos: 100.0})
    (now,) = engine.generate([PROMPTS[1]], towards_eos)
    (later,) = engine.generate([PROMPTS[1]], towards_eos.replace(min_tokens=6))
    assert now.token_ids == [eos] and now.finish_reason is FinishReason.EOS and now.text == ""
    assert len(later.token_ids) == 7 and later.token_ids[-1] == eos and eos not in later.token_ids[:6]
    assert later.finish_reason is FinishReason.EOS


def test_a_stop_string_counts_only_from_min_tokens_on(llama, make_engine) -> None:
    engine = make_engine(llama)
    (free,) = engine.generate([PROMPTS[2]], SamplingParams(max_new_tokens=12, ignore_eos=True))
    stop = free.text[1:3]
    assert stop and free.text.index(stop) < len(free.text) - 2
    (early,) = engine.generate([PROMPTS[2]], SamplingParams(max_new_tokens=12, ignore_eos=True, stop=[stop]))
    (kept,) = engine.generate(
        [PROMPTS[2]], SamplingParams(max_new_tokens=12, ignore_eos=True, stop=[stop], include_stop_str_in_output=True)
    )
    assert early.text == free.text[: free.text.index(stop)] and early.finish_reason is FinishReason.STOP
    assert kept.text == free.text[: free.text.index(stop) + len(stop)]
    (late,) = engine.generate(
        [PROMPTS[2]], SamplingParams(max_new_tokens=12, ignore_eos=True, stop=[stop], min_tokens=12)
    )
    assert late.text == free.text and late.finish_reason is FinishReason.LENGTH


def test_token_ids_outside_the_vocabulary_are_rejected(llama, make_engine) -> None:
    engine = make_engine(llama, graphs=False)
    biased = engine.submit("hi", SamplingParams(logit_bias={10**6: 1.0}))
    stopped = engine.submit("hi", SamplingParams(stop_token_ids=[10**6]))
    assert biased.finish_reason is stopped.finish_reason is FinishReason.REJECTED
    assert "logit_bias holds token id 1000000, outside the vocabulary" in biased.error
    assert "stop_token_ids holds token id" in stopped.error
