"""Bad input and faults: every bad request is a 400 with an OpenAI error object naming the field (never a
422 or a traceback), a full queue is a 429 with Retry-After, a client that leaves mid-stream frees its
KV pages, and an engine failure is a 500 with one line while ``/health`` turns 503."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from support.serve_support import MODEL_NAME, TIMEOUT_S, engine_idle, serving, wait_until

from graphtop.engine.errors import TensorParallelError
from graphtop.engine.telemetry import events as ev
from graphtop.server.options import ServeOptions

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "x"}]


def post(url: str, path: str, body, **kwargs) -> httpx.Response:
    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return httpx.post(
        url + path, content=content, headers={"content-type": "application/json"}, timeout=TIMEOUT_S, **kwargs
    )


def assert_error(response: httpx.Response, status: int, param=None, code=None, needle: str = "") -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and "\n" not in error["message"] and "Traceback" not in error["message"]
    assert error["param"] == param and (code is None or error["code"] == code), error
    assert needle in error["message"], error["message"]
    return error


BAD = [
    # (path, body, param, code, words of the message)
    (COMPLETIONS, '{"prompt": "x",', None, "invalid_json", "not valid JSON"),
    (COMPLETIONS, "[1, 2]", None, None, "must be a JSON object"),
    (COMPLETIONS, "", None, "missing_body", "the request body is empty"),
    (COMPLETIONS, '{"prompt": "\\ud800"}', "prompt", None, "prompt is not valid Unicode"),
    (CHAT, '{"messages": [{"role": "user", "content": "\\ud800"}]}', "messages[0].content", None, "not valid Unicode"),
    (COMPLETIONS, {"prompt": "x", "temperature": "hot"}, "temperature", "invalid_value", "valid number"),
    (COMPLETIONS, {"prompt": "x", "max_tokens": "8"}, "max_tokens", "invalid_value", "valid integer"),
    (COMPLETIONS, {"prompt": "x", "n": True}, "n", "invalid_value", "valid integer"),
    (COMPLETIONS, {"prompt": "x", "stream": "yes"}, "stream", "invalid_value", "boolean"),
    (COMPLETIONS, {"prompt": 5}, "prompt", None, "prompt must be a string"),
    (COMPLETIONS, {"prompt": []}, "prompt", None, "prompt is empty"),
    (COMPLETIONS, {"max_tokens": 3}, "prompt", "missing_field", "prompt is required"),
    (COMPLETIONS, {"prompt": "x", "max_tokens": 0}, "max_tokens", "invalid_value", "at least 1 (0 only with echo)"),
    (COMPLETIONS, {"prompt": "x", "logprobs": 21}, "logprobs", "invalid_value", "logprobs must be at most 20"),
    (COMPLETIONS, {"prompt": "x", "logprobs": True}, "logprobs", "invalid_value", "valid integer"),
    (COMPLETIONS, {"prompt": "x", "suffix": "y"}, "suffix", "unsupported_field", "suffix is not supported"),
    (COMPLETIONS, {"prompt": "x", "presence_penalty": 2.5}, "presence_penalty", "invalid_value", "in [-2, 2]"),
    (COMPLETIONS, {"prompt": "x", "repetition_penalty": 0}, "repetition_penalty", "invalid_value", "must be > 0"),
    (COMPLETIONS, {"prompt": "x", "temperature": 2.5}, "temperature", "invalid_value", "less than or equal to 2"),
    (COMPLETIONS, {"prompt": "x", "temperature": -1}, "temperature", "invalid_value", "temperature must be >= 0"),
    (COMPLETIONS, {"prompt": "x", "min_p": 2}, "min_p", "invalid_value", "min_p must be in [0, 1]"),
    (COMPLETIONS, {"prompt": "x", "logit_bias": {"x": 1}}, "logit_bias", "invalid_value", "keys must be token ids"),
    (COMPLETIONS, {"prompt": "x", "logit_bias": {"5": 500}}, "logit_bias", "invalid_value", "in [-100, 100]"),
    (COMPLETIONS, {"prompt": "x", "logit_bias": {"99999": 1}}, "logit_bias", "invalid_value", "outside the vocabulary"),
    (COMPLETIONS, {"prompt": "x", "stop_token_ids": [-3]}, "stop_token_ids", "invalid_value", "integer >= 0"),
    (
        COMPLETIONS,
        {"prompt": "x", "min_tokens": -2},
        "min_tokens",
        "invalid_value",
        "min_tokens must be an integer >= 0",
    ),
    (COMPLETIONS, {"prompt": "x", "best_of": 3}, "best_of", "unsupported_field", "best_of is not supported"),
    (COMPLETIONS, {"prompt": "x", "use_beam_search": True}, "use_beam_search", "unsupported_field", "not supported"),
    (COMPLETIONS, {"prompt": "x", "prompt_logprobs": 1}, "prompt_logprobs", "unsupported_field", "not supported"),
    (
        COMPLETIONS,
        {"prompt": "x", "response_format": {"type": "json_object"}},
        "response_format",
        "unsupported_field",
        "response_format is not supported",
    ),
    (COMPLETIONS, {"prompt": "x", "add_special_tokens": False}, "add_special_tokens", "unsupported_field", "not"),
    (COMPLETIONS, {"prompt": "x", "stop": [""]}, "stop", None, "must not be empty"),
    (COMPLETIONS, {"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options", None, "stream: true"),
    (COMPLETIONS, {"prompt": "x", "top_p": 0}, "top_p", "invalid_value", "top_p must be in (0, 1]"),
    (COMPLETIONS, {"prompt": "x", "seed": -1}, "seed", "invalid_value", "seed must be an integer >= 0"),
    (COMPLETIONS, {"prompt": "x", "n": 1000}, "n", "invalid_value", "less than or equal to 16"),
    (COMPLETIONS, {"prompt": [[1, 2], [99999]]}, "prompt", "invalid_prompt", "outside the vocabulary"),
    (CHAT, {"messages": []}, "messages", None, "non-empty list"),
    (CHAT, {"messages": [{"role": "user"}]}, "messages[0].content", None, "string or a list of text parts"),
    (CHAT, {"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role", "unsupported_value", "'tool'"),
    (
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        "messages[0].content[0].type",
        "unsupported_value",
        "text only",
    ),
    (
        CHAT,
        {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
        "tools",
        "unsupported_field",
        "tools is not supported",
    ),
    (
        CHAT,
        {"messages": [{"role": "user", "content": "x"}], "max_tokens": 3, "max_completion_tokens": 4},
        "max_tokens",
        None,
        "disagree",
    ),
    (CHAT, {"messages": MSG, "tool_choice": "auto"}, "tool_choice", "unsupported_field", "tool_choice is not"),
    (CHAT, {"messages": MSG, "top_logprobs": 2}, "top_logprobs", None, "top_logprobs needs logprobs: true"),
    (CHAT, {"messages": MSG, "logprobs": True, "top_logprobs": 30}, "top_logprobs", "invalid_value", "at most 20"),
    (CHAT, {"messages": MSG, "logprobs": 1}, "logprobs", "invalid_value", "valid boolean"),
    (CHAT, {"messages": MSG, "max_completion_tokens": 0}, "max_completion_tokens", "invalid_value", "at least 1"),
    (CHAT, {"messages": MSG, "echo": True}, "echo", "unsupported_field", "echo is not supported"),
    (CHAT, {"messages": MSG, "chat_template": "{{ 1 }}"}, "chat_template", "unsupported_field", "not supported"),
    (
        CHAT,
        {"messages": MSG, "chat_template_kwargs": {"tokenize": False}},
        "chat_template_kwargs",
        None,
        "chat_template_kwargs may not set 'tokenize'",
    ),
    (
        CHAT,
        {"messages": MSG, "continue_final_message": True},
        "chat_template_kwargs",
        None,
        "cannot both be true",
    ),
]


@pytest.mark.parametrize("path, body, param, code, needle", BAD, ids=[f"{i}" for i in range(len(BAD))])
def test_each_bad_request_is_a_400_naming_what_is_wrong(served, path, body, param, code, needle) -> None:
    assert_error(post(served.url, path, body), 400, param, code, needle)
    assert engine_idle(served.engine)  # refused before anything was submitted


def test_a_prompt_over_the_context_is_a_400(served) -> None:
    long_prompt = list(range(3, 3 + served.engine.max_context_len))
    error = assert_error(
        post(served.url, COMPLETIONS, {"prompt": long_prompt, "max_tokens": 2}),
        400,
        "prompt",
        "context_length_exceeded",
        "the context limit is",
    )
    assert str(served.engine.max_context_len) in error["message"]


def test_a_max_tokens_past_any_context_and_neutral_values_are_accepted(served) -> None:
    near_the_end = [3 + i % 500 for i in range(served.engine.max_context_len - 3)]  # room for 3 tokens
    huge = post(served.url, COMPLETIONS, {"prompt": near_the_end, "max_tokens": 10**15, "ignore_eos": True})
    assert huge.status_code == 200 and huge.json()["choices"][0]["finish_reason"] == "length"  # the context ends it
    assert huge.json()["usage"]["completion_tokens"] == 3
    body = {
        "prompt": "Hi",
        "max_tokens": 2,
        "logprobs": None,
        "echo": False,
        "frequency_penalty": 0,
        "presence_penalty": 0.0,
        "best_of": 1,
        "user": "someone",
    }
    assert post(served.url, COMPLETIONS, body).status_code == 200


def test_a_body_sent_as_text_is_refused_as_not_json(served) -> None:
    response = httpx.post(
        served.url + COMPLETIONS, content='{"prompt": "Hi"}', headers={"content-type": "text/plain"}, timeout=TIMEOUT_S
    )
    assert_error(response, 400, needle="Content-Type: application/json")


def test_a_bug_is_a_500_with_one_line(served, monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("boom\nline two")

    monkeypatch.setattr(served.engine, "submit", broken)
    assert_error(post(served.url, COMPLETIONS, {"prompt": "Hi"}), 500, needle="internal error: RuntimeError: boom")
    monkeypatch.undo()
    assert post(served.url, COMPLETIONS, {"prompt": "Hi", "max_tokens": 2}).status_code == 200


def test_unknown_routes_and_methods_are_error_objects(served) -> None:
    assert_error(httpx.get(served.url + "/v1/nothing", timeout=TIMEOUT_S), 404, needle="no route /v1/nothing")
    assert_error(httpx.get(served.url + COMPLETIONS, timeout=TIMEOUT_S), 405)


def test_a_full_queue_is_a_429_with_retry_after(demo_model) -> None:
    options = ServeOptions(port=0, model_name=MODEL_NAME, max_queued_requests=0)
    with serving(demo_model, options=options, max_running_requests=2) as s:
        long = {"prompt": "Hi", "max_tokens": 1000, "ignore_eos": True, "stream": True}
        with httpx.Client(timeout=TIMEOUT_S) as client:
            with (
                client.stream("POST", s.url + COMPLETIONS, json=long) as first,
                client.stream("POST", s.url + COMPLETIONS, json=long) as second,
            ):
                assert first.status_code == second.status_code == 200
                error = assert_error(
                    post(s.url, COMPLETIONS, {"prompt": "Hi", "max_tokens": 2}),
                    429,
                    code="too_many_requests",
                    needle="limit of 2 requests",
                )
                assert error["type"] == "rate_limit_error"
                assert post(s.url, COMPLETIONS, {"prompt": "Hi"}).headers["retry-after"] == "1"
        wait_until(lambda: engine_idle(s.engine), what="the cancelled streams to free their pages")
        assert post(s.url, COMPLETIONS, {"prompt": "Hi", "max_tokens": 2}).status_code == 200  # room again


def test_a_client_that_leaves_mid_stream_is_cancelled_and_frees_its_pages(served) -> None:
    finished = served.bus.subscribe("finished", types=["request_finished"])
    with httpx.Client(timeout=TIMEOUT_S) as client:
        with client.stream(
            "POST",
            served.url + COMPLETIONS,
            json={"prompt": "Hello", "max_tokens": 1500, "ignore_eos": True, "stream": True},
        ) as r:
            lines = r.iter_lines()
            got = [next(lines) for _ in range(6)]  # a few chunks: the request is running
            assert any(line.startswith("data: {") for line in got)
            assert served.engine.pool.used_pages > 0
    wait_until(lambda: engine_idle(served.engine), what="the request to be cancelled")
    wait_until(lambda: finished.pending > 0, what="its request_finished event")
    (event,) = [e for e in finished.drain() if isinstance(e, ev.RequestFinished)]
    assert event.finish_reason == "cancelled" and event.output_tokens < 1500
    served.bus.unsubscribe(finished)


def test_a_client_that_leaves_a_non_streaming_request_is_cancelled(served) -> None:
    started = threading.Event()
    queued = served.bus.subscribe("queued", types=["request_queued", "request_finished"])

    def leave() -> None:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                served.url + COMPLETIONS,
                json={"prompt": "Hello", "max_tokens": 2000, "ignore_eos": True},
                timeout=httpx.Timeout(TIMEOUT_S, read=0.5),
            )
        started.set()

    thread = threading.Thread(target=leave)
    thread.start()
    thread.join(TIMEOUT_S)
    assert started.is_set()
    wait_until(lambda: engine_idle(served.engine), what="the abandoned request to be cancelled")
    reasons = [e.finish_reason for e in queued.drain() if isinstance(e, ev.RequestFinished)]
    assert reasons == ["cancelled"]
    served.bus.unsubscribe(queued)


def test_a_failed_step_is_a_500_with_one_line_and_the_server_goes_on(demo_model) -> None:
    with serving(demo_model) as s:
        real = s.engine.loop.step
        calls = {"n": 0}

        def failing() -> bool:  # the first step that has a request to serve fails
            if s.engine.scheduler.has_work() and calls["n"] == 0:
                calls["n"] += 1
                raise RuntimeError("device fell over\nsecond line of a long story")
            return real()

        s.engine.loop.step = failing
        # ignore_eos: a sampled end of text at the first token would finish it before any failing step
        assert_error(
            post(s.url, COMPLETIONS, {"prompt": "Hi", "max_tokens": 3, "ignore_eos": True}),
            500,
            code="engine_error",
            needle="the engine failed this request: RuntimeError: device fell over",
        )
        health = httpx.get(s.url + "/health", timeout=TIMEOUT_S)
        assert health.status_code == 200 and "device fell over" in health.json()["last_error"]
        assert post(s.url, COMPLETIONS, {"prompt": "Hi", "max_tokens": 3}).status_code == 200


def test_a_fatal_engine_failure_turns_health_unhealthy(demo_model) -> None:
    with serving(demo_model) as s:
        real = s.engine.loop.step

        def fatal() -> bool:  # a rank dies at the first step with a request
            if s.engine.scheduler.has_work():
                raise TensorParallelError("rank 1 died")
            return real()

        s.engine.loop.step = fatal
        stream = {"prompt": "Hi", "max_tokens": 3, "stream": True, "ignore_eos": True}
        with httpx.Client(timeout=TIMEOUT_S) as client, client.stream("POST", s.url + COMPLETIONS, json=stream) as r:
            body = r.read().decode()
        assert r.status_code == 200  # the status was sent before the failure: the error is in the stream
        chunks = [json.loads(part) for part in body.split("data: ")[1:-1]]
        error = chunks[-1]["error"]
        assert all("error" not in c for c in chunks[:-1])
        assert error["code"] == "engine_error" and "rank 1 died" in error["message"]
        assert body.endswith("data: [DONE]\n\n")
        assert_error(
            httpx.get(s.url + "/health", timeout=TIMEOUT_S), 503, code="engine_unavailable", needle="rank 1 died"
        )
        assert_error(post(s.url, COMPLETIONS, {"prompt": "Hi", "max_tokens": 3}), 503, code="engine_unavailable")
