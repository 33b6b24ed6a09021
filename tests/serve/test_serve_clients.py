"""The requests benchmark and evaluation tools send, replayed byte for byte as they build them, and read
back as they read them: guidellm, ``vllm bench serve``, aiperf and lm-eval's ``local-completions``
(loglikelihood and generate_until). Loopback only; every request bounded in tokens and time."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from operator import itemgetter

import httpx
import pytest
from support.serve_support import MODEL_NAME, TIMEOUT_S, engine_idle, wait_until

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
PROMPT = "The quick brown fox jumps over"
N = 8


def post(url: str, path: str, body: dict, **headers: str) -> dict:
    r = httpx.post(url + path, json=body, headers=headers, timeout=TIMEOUT_S)
    assert r.status_code == 200, r.text
    return r.json()


def sse(url: str, path: str, body: dict) -> list[dict]:
    """The data chunks of a stream, as these tools split it (``data: `` lines until ``[DONE]``)."""
    with httpx.Client(timeout=TIMEOUT_S) as client, client.stream("POST", url + path, json=body) as r:
        assert r.status_code == 200, r.read()
        lines = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def text_of(chunks: list[dict], chat: bool) -> str:
    if chat:
        return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    return "".join(c["choices"][0].get("text") or "" for c in chunks if c["choices"])


# --- guidellm (backends/openai/request_handlers.py): every chunk carries the running usage -------------
GUIDELLM_STREAM = {"include_usage": True, "continuous_usage_stats": True}


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_guidellm_requests(served, chat) -> None:
    body = {"model": MODEL_NAME, "stream": True, "stream_options": GUIDELLM_STREAM, "stop": None, "ignore_eos": True}
    if chat:
        body.update(max_completion_tokens=N, messages=[{"role": "user", "content": [{"type": "text", "text": PROMPT}]}])
    else:
        body.update(max_tokens=N, prompt=PROMPT)
    chunks = sse(served.url, CHAT if chat else COMPLETIONS, body)
    usage = [c["usage"] for c in chunks]
    assert all(u is not None for u in usage) and usage[-1]["completion_tokens"] == N
    assert usage[-1]["prompt_tokens"] > 0 and text_of(chunks, chat)


# --- vllm bench serve (vllm/benchmarks/lib/endpoint_request_func.py) ----------------------------------
def vllm_bench_body(chat: bool, **extra_body) -> dict:
    body = {"model": MODEL_NAME, "stream": True, "stream_options": {"include_usage": True}}
    if chat:
        body.update(messages=[{"role": "user", "content": [{"type": "text", "text": PROMPT}]}], max_completion_tokens=N)
    else:
        body.update(prompt=PROMPT, repetition_penalty=1.0, max_tokens=N, logprobs=None)
    body["ignore_eos"] = True  # --ignore-eos
    body.update({"temperature": 0.0, **extra_body})  # the sampling flags, greedy unless given
    return body


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_vllm_bench_serve_requests_keep_the_fast_path(served, chat) -> None:
    want = served.greedy(PROMPT, N, chat=chat, ignore_eos=True)
    before = served.engine.loop.overlapped_steps
    r = httpx.post(
        served.url + (CHAT if chat else COMPLETIONS),
        json=vllm_bench_body(chat),
        headers={"x-request-id": "bench-0"},
        timeout=TIMEOUT_S,
    )
    assert r.status_code == 200
    chunks = [json.loads(x.removeprefix("data: ")) for x in r.text.split("\n\n") if x and x != "data: [DONE]"]
    assert text_of(chunks, chat) == want.text and chunks[-1]["usage"]["completion_tokens"] == N
    # repetition_penalty 1.0 asks for nothing: decode steps still chain under the overlap schedule
    assert served.engine.loop.overlapped_steps > before


def test_vllm_bench_serve_sampling_flags(served) -> None:
    flags = dict(top_p=0.9, top_k=20, min_p=0.05, temperature=0.7, frequency_penalty=0.1, presence_penalty=0.1)
    for chat in (False, True):
        chunks = sse(served.url, CHAT if chat else COMPLETIONS, vllm_bench_body(chat, repetition_penalty=1.1, **flags))
        assert chunks[-1]["usage"]["completion_tokens"] == N and chunks[-1]["choices"] == []


def test_vllm_bench_serve_without_a_model_takes_the_first_served_one(served) -> None:
    """With no ``--model``, vllm bench serve (serve.py's ``get_first_model_from_server``) names the first
    model of ``/v1/models`` in its requests and loads its tokenizer from that model's ``root``."""
    r = httpx.get(served.url + "/v1/models", timeout=TIMEOUT_S)
    assert r.status_code == 200
    first = r.json()["data"][0]
    model_name, model_id = first["id"], first["root"]
    assert model_name == MODEL_NAME and isinstance(model_id, str) and model_id
    chunks = sse(served.url, COMPLETIONS, {**vllm_bench_body(False), "model": model_name})
    assert chunks[-1]["usage"]["completion_tokens"] == N


# --- aiperf (endpoints/openai_completions.py, openai_chat.py) with --extra-inputs ignore_eos, min_tokens --
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_aiperf_requests_with_extra_inputs(served, chat) -> None:
    extra = {"ignore_eos": True, "min_tokens": N}
    if chat:
        body = {"messages": [{"role": "user", "content": PROMPT}], "model": MODEL_NAME, "stream": True}
        body.update(max_completion_tokens=N, **extra, stream_options={"include_usage": True})
    else:
        body = {"prompt": [PROMPT], "model": MODEL_NAME, "stream": True, "max_tokens": N, **extra}
        body["stream_options"] = {"include_usage": True}
    chunks = sse(served.url, CHAT if chat else COMPLETIONS, body)
    assert chunks[-1]["usage"]["completion_tokens"] == N
    plain = post(served.url, CHAT if chat else COMPLETIONS, {**body, "stream": False, "stream_options": None})
    assert plain["usage"]["completion_tokens"] == N and plain["choices"][0]["finish_reason"] == "length"


# --- lm-eval local-completions (lm_eval/models/openai_completions.py) ----------------------------------
def parse_logprobs(out: dict, ctxlens: list[int]) -> list[tuple[float, bool]]:
    """lm-eval's ``LocalCompletionsAPI.parse_logprobs``, as it reads a loglikelihood response."""
    res = []
    for choice, ctxlen in zip(sorted(out["choices"], key=itemgetter("index")), ctxlens):
        logprobs = choice["logprobs"]["token_logprobs"][ctxlen:-1]
        tops = choice["logprobs"]["top_logprobs"][ctxlen:-1]
        res.append((sum(logprobs), all(tok == max(top.values()) for tok, top in zip(logprobs, tops))))
    return res


def test_lm_eval_loglikelihood_with_token_ids(served) -> None:
    tok = served.engine.tokenizer
    context, continuations = tok.encode("Question: what do cats chase? Answer:"), [" mice", " the moon"]
    prompts = [context + tok.encode(c) for c in continuations]
    body = {"model": MODEL_NAME, "prompt": prompts, "temperature": 0, "max_tokens": 1, "logprobs": 1}
    out = post(served.url, COMPLETIONS, {**body, "seed": 1234, "echo": True})
    got = parse_logprobs(out, [len(context)] * 2)
    for (total, _), prompt in zip(got, prompts):
        ref = served.greedy(prompt, 1, prompt_logprobs=1).prompt_logprobs  # entry i scores token i + 1
        assert total == pytest.approx(sum(e.logprob for e in ref[len(context) - 1 :]), abs=1e-4)
    for choice, prompt in zip(out["choices"], prompts):
        assert len(choice["logprobs"]["token_logprobs"]) == len(prompt) + 1  # the prompt's, then the generated one
    # the prompt scored alone (max_tokens 0): the same values, one fewer entry
    zero = post(served.url, COMPLETIONS, {**body, "max_tokens": 0, "echo": True})
    for a, b in zip(zero["choices"], out["choices"]):
        assert a["logprobs"]["token_logprobs"] == pytest.approx(b["logprobs"]["token_logprobs"][:-1], abs=1e-5)
        assert zero["usage"]["completion_tokens"] == 0


def test_lm_eval_loglikelihood_is_greedy_flag(served) -> None:
    tok = served.engine.tokenizer
    context = tok.encode("Once upon a time")
    greedy = served.greedy(context, 3, ignore_eos=True).token_ids
    body = {"model": MODEL_NAME, "prompt": [context + greedy], "temperature": 0, "max_tokens": 1, "logprobs": 1}
    ((_, is_greedy),) = parse_logprobs(post(served.url, COMPLETIONS, {**body, "echo": True}), [len(context)])
    assert is_greedy  # the model's own greedy continuation is greedy to lm-eval too
    other = [t for t in range(5, 50) if t != greedy[0]][0]
    body["prompt"] = [context + [other] + greedy[1:]]
    ((_, is_greedy),) = parse_logprobs(post(served.url, COMPLETIONS, {**body, "echo": True}), [len(context)])
    assert not is_greedy


def test_lm_eval_loglikelihood_with_text(served) -> None:
    body = {"model": MODEL_NAME, "prompt": "Hello there", "temperature": 0, "max_tokens": 1, "logprobs": 1}
    choice = post(served.url, COMPLETIONS, {**body, "seed": 1234, "echo": True})["choices"][0]
    assert choice["text"].startswith("Hello there") and choice["logprobs"]["token_logprobs"][0] is None
    assert all(isinstance(v, float) for v in choice["logprobs"]["token_logprobs"][1:])


def test_lm_eval_generate_until(served) -> None:
    stop = ["\n\n", "Question:", "<|endoftext|>"]
    prompts = ["Once upon a time", "The quick brown fox"]
    body = {"prompt": prompts, "model": MODEL_NAME, "max_tokens": 12, "temperature": 0, "stop": stop, "seed": 1234}
    out = post(served.url, COMPLETIONS, body)
    texts = [None] * 2
    for choice in out["choices"]:
        texts[choice["index"]] = choice["text"]
    assert texts == [served.greedy(p, 12, stop=stop).text for p in prompts]


def test_a_burst_of_mixed_requests_is_served(served) -> None:
    """Bounded load over loopback: plain, penalised, sampled and log-probability requests at once."""
    bodies = [
        vllm_bench_body(False),
        vllm_bench_body(True, repetition_penalty=1.3),
        {"prompt": PROMPT, "max_tokens": N, "logprobs": 3, "echo": True, "temperature": 0},
        {"prompt": PROMPT, "max_tokens": N, "temperature": 0.8, "seed": 5, "logit_bias": {"7": 3}, "min_p": 0.1},
        {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": N, "logprobs": True, "top_logprobs": 2},
    ] * 3

    def send(body: dict) -> int:
        path = CHAT if "messages" in body else COMPLETIONS
        r = httpx.post(served.url + path, json=body, timeout=TIMEOUT_S)
        return r.status_code

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(send, bodies)) == [200] * len(bodies)
    wait_until(lambda: engine_idle(served.engine), what="the engine to be idle")
