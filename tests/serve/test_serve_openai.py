"""The API through the official ``openai`` client: greedy completions and chat completions, streamed and
not, equal the engine's own greedy output for the same prompts; the sampling fields reach the engine."""

from __future__ import annotations

import httpx
import openai
import pytest
from support.serve_support import MODEL_NAME, TIMEOUT_S, engine_idle, serving, wait_until

from graphtop.server.options import ServeOptions

PROMPTS = ["Hello there", "The cat sat on", "def fibonacci(n):"]
MAX = 12


@pytest.mark.parametrize("prompt", PROMPTS)
def test_completions_equal_the_engines_greedy_output(served, prompt) -> None:
    want = served.greedy(prompt, MAX)
    client = served.client()
    plain = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=MAX, temperature=0)
    chunks = list(
        client.completions.create(
            model=MODEL_NAME,
            prompt=prompt,
            max_tokens=MAX,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert plain.choices[0].text == want.text
    assert plain.usage.completion_tokens == len(want.token_ids) and plain.usage.prompt_tokens == len(want.prompt_ids)
    assert plain.choices[0].finish_reason == "length" == want.finish_reason.value
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(want.token_ids)
    assert all(c.usage is None for c in chunks[:-1])


@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_chat_completions_equal_the_engines_greedy_chat_output(served, prompt) -> None:
    want = served.greedy(prompt, MAX, chat=True)  # the chat template, as submit(chat=True) applies it
    client = served.client()
    messages = [{"role": "user", "content": prompt}]
    plain = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=MAX, temperature=0)
    stream = list(
        client.chat.completions.create(
            model=MODEL_NAME, messages=messages, max_completion_tokens=MAX, temperature=0, stream=True
        )
    )
    assert plain.choices[0].message.content == want.text and plain.choices[0].message.role == "assistant"
    assert plain.usage.prompt_tokens == len(want.prompt_ids) and plain.usage.completion_tokens == len(want.token_ids)
    assert stream[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in stream) == want.text
    assert stream[-1].choices[0].finish_reason == "length"


def test_token_id_prompts_several_prompts_and_n_choices(served) -> None:
    ids = served.greedy("Hello there", 1).prompt_ids
    want = [served.greedy(p, 5).text for p in (ids, "The cat sat on")]
    out = served.client().completions.create(
        model=MODEL_NAME,
        prompt=[ids, served.engine.tokenizer.encode("The cat sat on")],
        max_tokens=5,
        temperature=0,
        n=2,
    )
    assert [c.index for c in out.choices] == [0, 1, 2, 3]  # prompt p's choice j is p * n + j
    assert [c.text for c in out.choices] == [want[0], want[0], want[1], want[1]]
    assert out.usage.prompt_tokens == len(ids) + len(served.engine.tokenizer.encode("The cat sat on"))
    assert out.usage.completion_tokens == 20


def test_a_stop_string_ends_the_text_before_it(served) -> None:
    full = served.greedy("The cat sat on", MAX).text
    stop = full[3:5]
    assert stop and stop in full
    out = served.client().completions.create(
        model=MODEL_NAME, prompt="The cat sat on", max_tokens=MAX, temperature=0, stop=[stop]
    )
    assert out.choices[0].text == full[: full.index(stop)] and out.choices[0].finish_reason == "stop"


def test_a_seed_makes_sampling_repeatable_and_sampling_parameters_apply(served) -> None:
    client = served.client()
    args = dict(model=MODEL_NAME, prompt="Hello there", max_tokens=MAX, temperature=1.5, top_p=0.95, seed=7)
    first, again = (client.completions.create(**args).choices[0].text for _ in range(2))
    assert first == again
    others = {client.completions.create(**{**args, "seed": s}).choices[0].text for s in range(8, 12)}
    assert len(others | {first}) > 1  # sampling, not greedy: some seed gives another text
    top1 = client.completions.create(**{**args, "seed": 3}, extra_body={"top_k": 1}).choices[0].text
    assert top1 == served.greedy("Hello there", MAX).text  # top_k 1 is greedy whatever the temperature


def test_models_health_and_defaults(served) -> None:
    models = served.client().models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]
    health = httpx.get(f"{served.url}/health", timeout=TIMEOUT_S)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    out = served.client().completions.create(model=MODEL_NAME, prompt="Hello there")
    assert out.usage.completion_tokens <= 16  # OpenAI's default max_tokens for completions


def test_served_requests_leave_the_engine_idle(served) -> None:
    served.client().completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=3)
    wait_until(lambda: engine_idle(served.engine), what="the engine to be idle")


def test_an_api_key_is_required_on_v1_only(demo_model) -> None:
    with serving(demo_model, options=ServeOptions(port=0, model_name=MODEL_NAME, api_key="s3cret")) as s:
        with pytest.raises(openai.AuthenticationError) as info:
            s.client(api_key="wrong").completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=2)
        assert info.value.status_code == 401 and info.value.body["code"] == "invalid_api_key"
        assert s.client(api_key="s3cret").completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=2).choices
        bare = httpx.post(f"{s.url}/v1/completions", json={"prompt": "Hi"}, timeout=TIMEOUT_S)
        assert bare.status_code == 401 and bare.headers["www-authenticate"] == "Bearer"
        assert httpx.get(f"{s.url}/health", timeout=TIMEOUT_S).status_code == 200
