"""Log-probabilities over HTTP in OpenAI's two shapes, streamed and not, equal to the engine's own;
``echo`` with the prompt's; the running usage of ``continuous_usage_stats``; unknown fields accepted and
logged once; and the chat template's options reaching the template."""

from __future__ import annotations

import json
import logging
import math

import httpx
import pytest
from support.serve_support import MODEL_NAME, TIMEOUT_S

from graphtop.engine.prompts import chat_template_options, encode_messages
from graphtop.engine.sampling_params import SamplingParams

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
PROMPT = "The cat sat on"


def post(url: str, path: str, body: dict) -> dict:
    r = httpx.post(url + path, json=body, timeout=TIMEOUT_S)
    assert r.status_code == 200, r.text
    return r.json()


def stream(url: str, path: str, body: dict) -> list[dict]:
    with httpx.Client(timeout=TIMEOUT_S) as client, client.stream("POST", url + path, json=body) as r:
        assert r.status_code == 200, r.read()
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]


def test_completion_logprobs_and_echo_are_the_engines(served) -> None:
    want = served.greedy(PROMPT, 5, logprobs=2, prompt_logprobs=2)
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 5, "temperature": 0, "logprobs": 2}
    plain = post(served.url, COMPLETIONS, body)["choices"][0]
    echoed = post(served.url, COMPLETIONS, {**body, "echo": True})["choices"][0]
    lp = plain["logprobs"]
    assert plain["text"] == want.text and echoed["text"] == PROMPT + want.text
    assert lp["token_logprobs"] == pytest.approx([e.logprob for e in want.logprobs], abs=1e-5)
    for token, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert len(top) <= 3 and top[token] == value  # the 2 most likely, and the chosen one if not among them
    assert [max(top.values()) for top in lp["top_logprobs"]] == lp["token_logprobs"]  # greedy: the top one
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
    e = echoed["logprobs"]
    prompt_len = len(want.prompt_ids)
    assert len(e["tokens"]) == prompt_len + 5 and e["token_logprobs"][0] is None and e["top_logprobs"][0] is None
    assert e["token_logprobs"][1:prompt_len] == pytest.approx([x.logprob for x in want.prompt_logprobs], abs=1e-5)
    assert e["token_logprobs"][prompt_len:] == pytest.approx(lp["token_logprobs"], abs=1e-5)
    assert "".join(e["tokens"][:prompt_len]) == PROMPT


def test_max_tokens_zero_with_echo_scores_the_prompt_only(served) -> None:
    ids = served.engine.tokenizer.encode(PROMPT)
    out = post(served.url, COMPLETIONS, {"prompt": [ids, ids[:3]], "max_tokens": 0, "echo": True, "logprobs": 1})
    first, second = out["choices"]
    assert first["finish_reason"] == "length" and first["text"] == served.engine.tokenizer.decode(ids)
    assert len(first["logprobs"]["tokens"]) == len(ids) and len(second["logprobs"]["tokens"]) == 3
    assert second["logprobs"]["token_logprobs"] == pytest.approx(first["logprobs"]["token_logprobs"][:3], abs=1e-5)
    assert out["usage"] == {"prompt_tokens": len(ids) + 3, "completion_tokens": 0, "total_tokens": len(ids) + 3}


def test_streamed_logprobs_add_up_to_the_whole_response(served) -> None:
    body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 1, "echo": True, "stream": True}
    chunks = stream(served.url, COMPLETIONS, body)
    whole = post(served.url, COMPLETIONS, {**body, "stream": False})["choices"][0]
    pieces = [c["choices"][0]["logprobs"] for c in chunks if c["choices"]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["text"]
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert [x for p in pieces for x in p[key]] == whole["logprobs"][key]


def test_chat_logprobs_in_the_chat_shape(served) -> None:
    messages = [{"role": "user", "content": PROMPT}]
    want = served.greedy(PROMPT, 4, chat=True, logprobs=3)
    body = {"messages": messages, "max_tokens": 4, "temperature": 0, "logprobs": True, "top_logprobs": 3}
    content = post(served.url, CHAT, body)["choices"][0]["logprobs"]["content"]
    assert [c["logprob"] for c in content] == pytest.approx([e.logprob for e in want.logprobs], abs=1e-5)
    for c in content:
        assert len(c["top_logprobs"]) == 3 and c["top_logprobs"][0]["logprob"] == c["logprob"]
        assert c["bytes"] == list(c["token"].encode("utf-8"))
    only = post(served.url, CHAT, {**body, "top_logprobs": None})["choices"][0]["logprobs"]["content"]
    assert [c["top_logprobs"] for c in only] == [[]] * 4
    chunks = stream(served.url, CHAT, {**body, "stream": True})
    streamed = [x for c in chunks for x in (c["choices"][0]["logprobs"] or {}).get("content", [])]
    assert streamed == content
    ids = post(served.url, CHAT, {**body, "return_tokens_as_token_ids": True})["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in ids] == [f"token_id:{t}" for t in want.token_ids]


def test_continuous_usage_stats_put_the_running_usage_in_every_chunk(served) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    body = {"prompt": PROMPT, "max_tokens": 6, "ignore_eos": True, "stream": True, "stream_options": options}
    chunks = stream(served.url, COMPLETIONS, body)
    usages = [c["usage"] for c in chunks]
    assert all(u is not None for u in usages)
    done = [u["completion_tokens"] for u in usages]
    assert done == sorted(done) and done[-1] == 6 and chunks[-1]["choices"] == []
    assert all(u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] for u in usages)
    chat_body = {k: v for k, v in body.items() if k != "prompt"}
    chat = stream(served.url, CHAT, {"messages": [{"role": "user", "content": "Hi"}], **chat_body})
    assert all(c["usage"] is not None for c in chat) and chat[-1]["usage"]["completion_tokens"] == 6
    without = stream(served.url, COMPLETIONS, {**body, "stream_options": {"continuous_usage_stats": True}})
    assert all(c.get("usage") is None for c in without)  # vLLM's rule: only with include_usage


def test_unknown_fields_are_accepted_and_logged_once_per_name(served, caplog) -> None:
    body = {"prompt": "Hi", "max_tokens": 2, "ignore_eos": True, "zz_unknown_field": {"x": 1}, "priority": 3}
    body["stream"] = True
    body["stream_options"] = {"include_usage": True, "zz_nested": True}
    with caplog.at_level(logging.WARNING, logger="graphtop.serve"):
        for _ in range(2):
            assert stream(served.url, COMPLETIONS, body)[-1]["usage"]["completion_tokens"] == 2
    logged = [r.getMessage() for r in caplog.records if "is not one graphtop knows" in r.getMessage()]
    assert sorted(logged) == sorted(
        f"request field {name!r} is not one graphtop knows: it is ignored"
        for name in ("zz_unknown_field", "priority", "stream_options.zz_nested")
    )


def test_chat_template_options_reach_the_template(served, monkeypatch) -> None:
    tok = served.engine.tokenizer
    messages = [{"role": "user", "content": PROMPT}]
    seen = []
    real = tok.apply_chat_template

    def spy(*args, **kwargs):
        seen.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(tok, "apply_chat_template", spy)
    body = {"messages": messages, "max_tokens": 2, "chat_template_kwargs": {"enable_thinking": False}}
    post(served.url, CHAT, body)
    assert seen and all(k["enable_thinking"] is False and k["add_generation_prompt"] is True for k in seen)
    bare = post(served.url, CHAT, {**body, "add_generation_prompt": False})["usage"]["prompt_tokens"]
    want = encode_messages(tok, messages, template=chat_template_options(None, add_generation_prompt=False))
    assert bare == len(want) < post(served.url, CHAT, body)["usage"]["prompt_tokens"]
    go_on = messages + [{"role": "assistant", "content": "the"}]
    cont = {"messages": go_on, "max_tokens": 2, "add_generation_prompt": False, "continue_final_message": True}
    ids = encode_messages(tok, go_on, template=chat_template_options(None, False, True))
    assert post(served.url, CHAT, cont)["usage"]["prompt_tokens"] == len(ids)
    assert tok.decode(ids).endswith("the")  # the assistant's turn left open


def test_sampling_fields_reach_the_engine_by_name(served) -> None:
    top = served.engine.tokenizer.encode(" banana")[0]
    body = {"prompt": PROMPT, "max_tokens": 3, "temperature": 0, "logit_bias": {str(top): 100}}
    assert post(served.url, COMPLETIONS, body)["usage"]["completion_tokens"] == 3
    got = post(served.url, COMPLETIONS, {**body, "logprobs": 0})["choices"][0]["logprobs"]
    assert got["tokens"] == [served.engine.tokenizer.decode([top])] * 3
    assert all(math.isfinite(v) for v in got["token_logprobs"])  # raw logprobs: the bias is not in them
    params = SamplingParams(max_new_tokens=3, logit_bias={top: 100.0})
    assert served.engine.generate([PROMPT], params)[0].token_ids == [top] * 3
