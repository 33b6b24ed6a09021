"""A real model behind the API: SmolLM2-135M-Instruct's greedy answers through the ``openai`` client equal
the engine's own, plain and through the chat template, streamed and not. Runs when SmolLM2 has been
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
