"""Log-probabilities of generated and prompt tokens: the log-softmax of the raw model logits, as
transformers computes it from the same checkpoint (CPU fp32), in graph and eager steps alike; the prompt's
over several prefill chunks, once each even when a request is preempted; and nothing of it for the
requests that did not ask."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from support.engine_prompts import PROMPTS

from graphtop.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.usefixtures("torch_one_thread")
TOL = 2e-4


@pytest.fixture(scope="module")
def llama(tiny_ckpt):
    return tiny_ckpt("llama")


@pytest.fixture(scope="module")
def reference(llama):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(llama, dtype=torch.float32).eval()

    def logprobs(ids: list[int]) -> torch.Tensor:
        """[len(ids), vocab]: row i is the log-softmax after ids[: i + 1]."""
        with torch.no_grad():
            return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)

    return logprobs


def _check(entries, ids, ref: torch.Tensor, k: int) -> None:
    """``entries[j]`` scores ``ids[j]`` from ``ref[j]``."""
    assert len(entries) == len(ids)
    for entry, token, row in zip(entries, ids, ref):
        assert entry.token == token
        assert abs(entry.logprob - row[token].item()) < TOL
        values, order = torch.topk(row, k)
        assert [t for t, _ in entry.top][:1] == order.tolist()[:1]  # the most likely first
        assert len(entry.top) == k and all(abs(a - b) < TOL for (_, a), b in zip(entry.top, values.tolist()))


@pytest.mark.parametrize("graphs", [None, False], ids=["emulated-graphs", "eager"])
def test_generated_and_prompt_logprobs_equal_transformers(llama, make_engine, reference, graphs) -> None:
    engine = make_engine(llama, graphs=graphs)
    prompt = engine.tokenizer.encode(PROMPTS[2]) * 6  # over 64 tokens: two prefill chunks
    assert len(prompt) > 64
    params = SamplingParams(max_new_tokens=6, ignore_eos=True, logprobs=3, prompt_logprobs=2)
    plain = engine.submit(PROMPTS[0], SamplingParams(max_new_tokens=6, ignore_eos=True))
    handle = engine.submit(prompt, params)
    engine.run_until_idle()
    ref = reference(prompt + handle.token_ids)
    _check(handle.prompt_logprobs, prompt[1:], ref[: len(prompt) - 1], 2)
    _check(handle.logprobs, handle.token_ids, ref[len(prompt) - 1 : -1], 3)
    assert [e.logprob for e in handle.logprobs] == [e.top[0][1] for e in handle.logprobs]  # greedy: the top token
    assert plain.logprobs == [] and plain.prompt_logprobs == []


def test_sampled_tokens_and_zero_alternatives(llama, make_engine, reference) -> None:
    engine = make_engine(llama)
    params = SamplingParams(max_new_tokens=5, ignore_eos=True, temperature=1.0, seed=3, logprobs=0)
    (h,) = engine.generate([PROMPTS[1]], params)
    ref = reference(h.prompt_ids + h.token_ids)
    _check(h.logprobs, h.token_ids, ref[len(h.prompt_ids) - 1 : -1], 0)
    (again,) = engine.generate([PROMPTS[1]], params.replace(logprobs=None))
    assert again.token_ids == h.token_ids  # asking for logprobs does not change what is sampled


def test_a_preempted_request_scores_its_prompt_once(llama, make_engine, reference) -> None:
    engine = make_engine(llama, graphs=False, max_total_tokens=160, page_size=16)
    long_params = SamplingParams(max_new_tokens=40, ignore_eos=True, prompt_logprobs=1)
    prompts = [engine.tokenizer.encode(p) * 3 for p in PROMPTS[:4]]
    handles = [engine.submit(p, long_params) for p in prompts]
    engine.run_until_idle()
    assert engine.scheduler.num_preemptions > 0
    for h, p in zip(handles, prompts):
        _check(h.prompt_logprobs, p[1:], reference(p)[:-1], 1)


def test_new_logprobs_reads_what_came_since_the_last_read(llama, make_engine) -> None:
    engine = make_engine(llama)
    h = engine.submit(PROMPTS[0], SamplingParams(max_new_tokens=4, ignore_eos=True, logprobs=1))
    seen = []
    while not h.finished:
        engine.step()
        seen += h.new_logprobs()
    assert seen == h.logprobs and len(seen) == 4


def test_a_long_prompt_is_scored_a_bounded_number_of_rows_per_step(llama, make_engine, reference, monkeypatch) -> None:
    from graphtop.engine import scheduler

    monkeypatch.setattr(scheduler, "MAX_SCORED_ROWS", 10)
    engine = make_engine(llama)
    prompt = engine.tokenizer.encode(PROMPTS[2]) * 3
    steps = engine.bus.subscribe("steps", types=["step"])
    scored = engine.submit(prompt, SamplingParams(max_new_tokens=2, prompt_logprobs=0))
    other = engine.submit(prompt, SamplingParams(max_new_tokens=2))  # not scoring: not held back
    engine.run_until_idle()
    _check(scored.prompt_logprobs, prompt[1:], reference(prompt)[:-1], 0)
    prefill_tokens = [e.num_tokens for e in steps.drain() if e.phase == "prefill"]
    assert max(prefill_tokens) <= 10 + 64 and len(prefill_tokens) >= -(-(len(prompt) - 1) // 10)
    assert other.token_ids == scored.token_ids
