"""A conversation as a prompt: ``submit([{"role": ..., "content": ...}, ...])`` goes through the model's
chat template, a malformed one is a one-line ValueError, and a model without a template rejects it."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from graphtop.engine.prompts import conversation_problem
from graphtop.engine.request import FinishReason
from graphtop.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.usefixtures("torch_one_thread")

GREEDY = SamplingParams(max_new_tokens=4, ignore_eos=True)
CHAT = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "once upon a time"}]


@pytest.fixture(scope="module")
def engine(tiny_ckpt, make_engine):
    eng = make_engine(tiny_ckpt("llama"), graphs=False)
    yield eng
    eng.close()


def _template_ids(tok, messages):
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_a_conversation_goes_through_the_chat_template(engine):
    handle = engine.submit(CHAT, GREEDY)
    engine.run_until_done([handle])
    assert handle.prompt_ids == _template_ids(engine.tokenizer, CHAT)
    assert handle.prompt.startswith("<|im_start|>system\nYou answer briefly.<|im_end|>")  # the rendered conversation
    by_ids = engine.generate([handle.prompt_ids], GREEDY)[0]
    assert handle.token_ids == by_ids.token_ids and len(handle.token_ids) == 4
    text = engine.submit("once upon a time", GREEDY, chat=True)  # text with chat: one user message
    assert text.prompt_ids == _template_ids(engine.tokenizer, CHAT[1:])
    engine.run_until_done([text])


@pytest.mark.parametrize(
    "messages,problem",
    [
        ([], "'messages' is empty"),
        (
            [{"role": "robot", "content": "hi"}],
            "message #0: 'role' must be one of system, user, assistant, got 'robot'",
        ),
        ([{"role": "user", "content": 5}], "message #0: 'content' must be a string, got int"),
        ([{"role": "user"}], "message #0: no 'content'"),
        ([{"content": "hi"}], "message #0: no 'role'"),
        ([{"role": "user", "content": "hi", "name": "x"}], "message #0: unknown field(s) name"),
        (
            [{"role": "user", "content": "hi"}, "and text"],
            "message #1: a message is an object with 'role' and 'content'",
        ),
        ([{"role": "user", "content": "\ud800"}], "message #0: 'content' is not valid Unicode"),
    ],
)
def test_a_malformed_conversation_is_one_line(engine, messages, problem):
    if messages:  # (an empty list submitted is an empty list of token ids: rejected as an empty prompt)
        with pytest.raises(ValueError) as info:
            engine.submit(messages, GREEDY)
        assert str(info.value).startswith(f"bad conversation: {problem}") and "\n" not in str(info.value)
    assert (conversation_problem(messages) or "").startswith(problem)


def test_a_model_without_a_chat_template_rejects_a_conversation(engine, monkeypatch):
    monkeypatch.setattr(engine.tokenizer, "chat_template", None)
    handle = engine.submit(CHAT, GREEDY)
    assert handle.finish_reason is FinishReason.REJECTED
    assert handle.error == "the model has no chat template: a conversation ('messages') needs one"
