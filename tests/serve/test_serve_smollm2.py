"""A real model behind the API: SmolLM2-135M-Instruct's greedy answers through the ``openai`` client equal
the engine's own, plain and through the chat template, streamed and not; its log-probabilities equal
transformers' log-softmax on the same weights. Runs when SmolLM2 has been
fetched (``scripts/fetch_smollm2.py``, or ``GRAPHTOP_SMOLLM2_GGUF``), as tests/models/test_smollm2.py."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from support.paths import SCRIPTS
from support.serve_support import MODEL_NAME, serving


def _gguf() -> Path:
    if os.environ.get("GRAPHTOP_SMOLLM2_GGUF"):
        return Path(os.environ["GRAPHTOP_SMOLLM2_GGUF"]).expanduser()
    spec = importlib.util.spec_from_file_location("fetch_smollm2", SCRIPTS / "fetch_smollm2.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.gguf_path()


GGUF = _gguf()
pytestmark = pytest.mark.skipif(not GGUF.is_file(), reason=f"SmolLM2 not fetched ({GGUF})")
MAX = 12
TOL = 1e-4
"""fp32 on a CPU: graphtop's forward and transformers' differ in summation order only."""


@pytest.fixture(scope="module")
def smol():
    from graphtop.models.checkpoint.gguf import gguf_folder

    with serving(gguf_folder(GGUF)) as s:
        yield s


@pytest.mark.parametrize("prompt", ["The capital of France is", "def fibonacci(n):"])
def test_completions_equal_the_engines_greedy_output(smol, prompt) -> None:
    want = smol.greedy(prompt, MAX)
    client = smol.client()
    plain = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=MAX, temperature=0)
    streamed = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=MAX, temperature=0, stream=True)
    assert plain.choices[0].text == want.text and plain.usage.completion_tokens == len(want.token_ids)
    assert "".join(c.choices[0].text for c in streamed) == want.text


def test_chat_answers_equal_the_engines_and_know_paris(smol) -> None:
    question = "What is the capital of France?"
    want = smol.greedy(question, MAX, chat=True)
    client = smol.client()
    messages = [{"role": "user", "content": question}]
    plain = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=MAX, temperature=0)
    streamed = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=MAX, temperature=0, stream=True
    )
    assert plain.choices[0].message.content == want.text and plain.usage.prompt_tokens == len(want.prompt_ids)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == want.text
    assert "Paris" in want.text
    system = [{"role": "system", "content": "You are terse."}, *messages]
    assert client.chat.completions.create(model=MODEL_NAME, messages=system, max_tokens=4, temperature=0).choices


@pytest.fixture(scope="module")
def hf_logprobs():
    """transformers' log-softmax of its own fp32 forward on the converted folder: [len(ids), vocab]."""
    import torch
    from transformers import AutoModelForCausalLM

    from graphtop.models.checkpoint.gguf import gguf_folder

    model = AutoModelForCausalLM.from_pretrained(gguf_folder(GGUF), dtype=torch.float32).eval()

    def logprobs(ids: list[int]):
        with torch.no_grad():
            return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)

    return logprobs


def _ids(tokens: list[str]) -> list[int]:
    return [int(t.removeprefix("token_id:")) for t in tokens]


def test_logprobs_equal_transformers_log_softmax(smol, hf_logprobs) -> None:
    """Prompt (echo) and generated tokens' log-probabilities and their alternatives, completions and chat,
    within fp32 tolerance of transformers' on the same weights."""
    client = smol.client()
    out = client.completions.create(
        model=MODEL_NAME,
        prompt="The capital of France is",
        max_tokens=6,
        temperature=0,
        logprobs=3,
        echo=True,
        extra_body={"return_tokens_as_token_ids": True},
    )
    lp = out.choices[0].logprobs
    ids = _ids(lp.tokens)
    ref = hf_logprobs(ids)
    assert lp.token_logprobs[0] is None and len(ids) == out.usage.prompt_tokens + 6
    for j in range(1, len(ids)):
        assert abs(lp.token_logprobs[j] - ref[j - 1, ids[j]].item()) < TOL
        best = ref[j - 1].topk(3)
        top = {int(t.removeprefix("token_id:")): v for t, v in lp.top_logprobs[j].items()}
        assert all(abs(top[t] - v) < TOL for t, v in zip(best.indices.tolist(), best.values.tolist()))
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    chat = client.chat.completions.create(
        model=MODEL_NAME,
        messages=messages,
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        extra_body={"return_tokens_as_token_ids": True},
    )
    content = chat.choices[0].logprobs.content
    prompt = smol.greedy(messages, 1).prompt_ids
    generated = _ids([c.token for c in content])
    ref = hf_logprobs(prompt + generated)
    for j, c in enumerate(content):
        row = ref[len(prompt) - 1 + j]
        assert abs(c.logprob - row[generated[j]].item()) < TOL
        assert _ids([t.token for t in c.top_logprobs]) == row.topk(2).indices.tolist()
