"""The server's edges, in process: OpenAI's 404 for a model it does not serve, ``GET /v1/models/{id}``,
several served names, ``/health`` 503 at once while the model loads, the access log,
``graphtop:http_requests_total``, the default seed, a graceful stop that ends the streams still running
with an error chunk and ``[DONE]``, and the connection limits (headers timed, the oldest idle connection
closed to make room)."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from contextlib import contextmanager
from typing import Iterator

import httpx
import openai
import pytest
from support.serve_support import MODEL_NAME, TIMEOUT_S, engine_idle, wait_until
from test_serve_metrics import samples

from graphtop.server.options import ServeOptions
from graphtop.server.server import ApiServer

COMPLETIONS = "/v1/completions"
LONG = {"prompt": "Once", "max_tokens": 100_000, "ignore_eos": True, "temperature": 0}
"""A request that runs until the context ends it: seconds on the demo model."""


@contextmanager
def beside(served, **options) -> Iterator[ApiServer]:
    """Another server on the ``served`` engine, with these options."""
    server = ApiServer(served.engine, ServeOptions(port=0, model_name=MODEL_NAME, **options), metrics=served.metrics)
    server.start()
    try:
        yield server
    finally:
        server.close(now=True)


def test_an_unknown_model_is_openais_404_model_not_found(served) -> None:
    chat = {"messages": [{"role": "user", "content": "Hi"}], "model": "gpt-4"}
    for path, body in ((COMPLETIONS, {"prompt": "x", "model": "gpt-4"}), ("/v1/chat/completions", chat)):
        r = httpx.post(served.url + path, json=body, timeout=TIMEOUT_S)
        assert r.status_code == 404, r.text
        assert r.json()["error"] == {
            "message": "model 'gpt-4' is not served here; this server serves 'demo'",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    with pytest.raises(openai.NotFoundError):
        served.client().completions.create(model="gpt-4", prompt="x", max_tokens=1)
    assert engine_idle(served.engine)


def test_a_model_is_read_by_its_id(served) -> None:
    listed = httpx.get(f"{served.url}/v1/models", timeout=TIMEOUT_S).json()["data"][0]
    one = httpx.get(f"{served.url}/v1/models/{MODEL_NAME}", timeout=TIMEOUT_S)
    assert one.status_code == 200 and one.json() == listed
    assert served.client().models.retrieve(MODEL_NAME).id == MODEL_NAME
    for other in ("gpt-4", "org/model", "demo%20x"):
        r = httpx.get(f"{served.url}/v1/models/{other}", timeout=TIMEOUT_S)
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text


def test_several_served_names_are_all_accepted_and_listed_the_first_one_reported(served) -> None:
    """vLLM's ``--served-model-name A B``: ``/v1/models`` has a card per name (``root``: the model as given),
    requests may give any of them, and responses name the first."""
    with beside(served, model_aliases=("alias-1", "org/alias-2"), model_root="/models/demo") as server:
        cards = httpx.get(f"{server.url}/v1/models", timeout=TIMEOUT_S).json()["data"]
        assert [c["id"] for c in cards] == [MODEL_NAME, "alias-1", "org/alias-2"]
        assert {c["root"] for c in cards} == {"/models/demo"} and {c["parent"] for c in cards} == {None}
        for name in (MODEL_NAME, "alias-1", "org/alias-2"):
            one = httpx.get(f"{server.url}/v1/models/{name}", timeout=TIMEOUT_S)
            assert one.status_code == 200 and one.json()["id"] == name
            body = {"prompt": "Hi", "max_tokens": 2, "model": name}
            r = httpx.post(f"{server.url}{COMPLETIONS}", json=body, timeout=TIMEOUT_S)
            assert r.status_code == 200 and r.json()["model"] == MODEL_NAME, r.text
        chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "model": "alias-1"}
        r = httpx.post(f"{server.url}/v1/chat/completions", json=chat, timeout=TIMEOUT_S)
        assert r.status_code == 200 and r.json()["model"] == MODEL_NAME, r.text
        r = httpx.post(f"{server.url}{COMPLETIONS}", json={"prompt": "x", "model": "alias-3"}, timeout=TIMEOUT_S)
        message = r.json()["error"]["message"]
        assert r.status_code == 404 and message.endswith("serves 'demo', 'alias-1', 'org/alias-2'"), r.text
    assert engine_idle(served.engine)


def test_a_served_name_given_twice_or_empty_is_refused() -> None:
    with pytest.raises(ValueError, match="'a' is given twice"):
        ServeOptions(model_name="a", model_aliases=("b", "a"))
    with pytest.raises(ValueError, match="name is empty"):
        ServeOptions(model_name="a", model_aliases=("",))


def test_health_answers_503_at_once_while_the_model_loads_then_200(served) -> None:
    server = ApiServer(None, ServeOptions(port=0, model_name=MODEL_NAME), metrics=served.metrics).start()
    try:
        started = time.monotonic()
        health = httpx.get(f"{server.url}/health", timeout=TIMEOUT_S)
        assert time.monotonic() - started < 5  # answered, not held until the load ends
        assert health.status_code == 503 and health.headers["retry-after"] == "1"
        assert health.json()["error"]["code"] == "model_loading"
        for r in (
            httpx.get(f"{server.url}/v1/models", timeout=TIMEOUT_S),
            httpx.get(f"{server.url}/v1/models/{MODEL_NAME}", timeout=TIMEOUT_S),
            httpx.post(f"{server.url}{COMPLETIONS}", json={"prompt": "Hi", "max_tokens": 2}, timeout=TIMEOUT_S),
        ):
            assert r.status_code == 503 and r.json()["error"]["code"] == "model_loading", r.text
        assert httpx.get(f"{server.url}/metrics", timeout=TIMEOUT_S).status_code == 200
        server.attach(served.engine)
        assert httpx.get(f"{server.url}/health", timeout=TIMEOUT_S).json() == {"status": "ok"}
        r = httpx.post(
            f"{server.url}{COMPLETIONS}", json={"prompt": "Hi", "max_tokens": 2, "ignore_eos": True}, timeout=TIMEOUT_S
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    finally:
        server.close()


def _access_lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "graphtop.serve" and " ms" in r.getMessage()]


def test_each_request_has_an_access_log_line_with_its_tokens(served, caplog) -> None:
    caplog.set_level(logging.INFO, logger="graphtop.serve")
    client = served.client()
    client.completions.create(model=MODEL_NAME, prompt="Hello there", max_tokens=3, temperature=0)
    stream = client.completions.create(
        model=MODEL_NAME, prompt="Hi", max_tokens=4, stream=True, extra_body={"ignore_eos": True}
    )
    for _ in stream:  # ignore_eos: a sampled end of text would make it fewer tokens
        pass
    httpx.get(f"{served.url}/v1/models/nope", timeout=TIMEOUT_S)
    httpx.get(f"{served.url}/nope%0Aforged", timeout=TIMEOUT_S)
    wait_until(lambda: len(_access_lines(caplog)) >= 4, 10, "the access log lines")
    lines = [(r.levelno, r.getMessage()) for r in _access_lines(caplog)]
    done = [m for level, m in lines if level == logging.INFO and f"POST {COMPLETIONS} 200 " in m]
    assert any("completion_tokens=3" in m for m in done) and any("completion_tokens=4" in m for m in done), lines
    assert all(m.startswith("127.0.0.1:") and " prompt_tokens=" in m for m in done)
    errors = [m for level, m in lines if level == logging.WARNING]
    assert any("GET /v1/models/nope 404 " in m for m in errors), lines
    assert any("/nope\\x0aforged 404" in m for m in errors), lines  # one line, whatever the path holds
    assert all("\n" not in m for _, m in lines)


def test_the_access_log_can_be_switched_off(served, caplog) -> None:
    caplog.set_level(logging.INFO, logger="graphtop.serve")
    with beside(served, log_requests=False) as server:
        httpx.get(f"{server.url}/health", timeout=TIMEOUT_S)
        httpx.get(f"{server.url}/nope", timeout=TIMEOUT_S)
    assert not [r for r in _access_lines(caplog) if f":{server.port}" in r.getMessage() or "/nope" in r.getMessage()]


def _requests_total(url: str) -> dict[tuple, float]:
    text = httpx.get(f"{url}/metrics", timeout=TIMEOUT_S).text
    return {
        dict(k)["path"] + " " + dict(k)["method"] + " " + dict(k)["status"]: v
        for k, v in samples(text).get("graphtop:http_requests_total", {}).items()
    }


def test_http_requests_are_counted_by_method_route_and_status(served) -> None:
    before = _requests_total(served.url)
    for _ in range(2):
        httpx.post(f"{served.url}{COMPLETIONS}", json={"prompt": "Hi", "max_tokens": 1}, timeout=TIMEOUT_S)
    httpx.get(f"{served.url}/v1/models/nope", timeout=TIMEOUT_S)
    for i in range(30):  # a scan of random URLs: one series, not thirty
        httpx.request(["GET", "DELETE"][i % 2], f"{served.url}/scan/{i}", timeout=TIMEOUT_S)
    wait_until(lambda: _requests_total(served.url).get("/metrics GET 200", 0) >= before.get("/metrics GET 200", 0) + 1)
    after = _requests_total(served.url)

    def added(key: str) -> float:
        return after.get(key, 0) - before.get(key, 0)

    assert added(f"{COMPLETIONS} POST 200") == 2
    assert added("/v1/models/{model} GET 404") == 1
    assert added("other GET 404") == 15 and added("other other 404") + added("other other 405") == 15
    assert not [k for k in after if "/scan" in k]


def test_a_request_without_a_seed_takes_the_servers(served) -> None:
    body = {"prompt": "The", "max_tokens": 12, "temperature": 1.0}
    with beside(served, seed=7) as server:
        texts = [
            httpx.post(f"{server.url}{COMPLETIONS}", json=b, timeout=TIMEOUT_S).json()["choices"][0]["text"]
            for b in (body, body, {**body, "seed": 7})
        ]
    assert texts[0] == texts[1] == texts[2]


def _stream(url: str, body: dict, chunks: list, first: threading.Event) -> None:
    with httpx.stream("POST", f"{url}{COMPLETIONS}", json={**body, "stream": True}, timeout=TIMEOUT_S) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                chunks.append(line[len("data: ") :])
                first.set()


def test_a_graceful_stop_lets_short_requests_finish_and_ends_long_streams(served) -> None:
    server = ApiServer(served.engine, ServeOptions(port=0, model_name=MODEL_NAME, shutdown_timeout=1.0)).start()
    long_chunks: list = []
    short_chunks: list = []
    started, short_started = threading.Event(), threading.Event()
    clients = [
        threading.Thread(target=_stream, args=(server.url, LONG, long_chunks, started)),
        threading.Thread(
            target=_stream,
            args=(server.url, {"prompt": "Hi", "max_tokens": 3, "ignore_eos": True}, short_chunks, short_started),
        ),
    ]
    try:
        clients[0].start()
        assert started.wait(TIMEOUT_S)
        clients[1].start()
        assert short_started.wait(TIMEOUT_S)
        t0 = time.monotonic()
        server.close()
        assert time.monotonic() - t0 < 10
    finally:
        server.close(now=True)
        for c in clients:
            c.join(TIMEOUT_S)
    assert long_chunks[-1] == "[DONE]" and short_chunks[-1] == "[DONE]"
    error = json.loads(long_chunks[-2])["error"]
    assert error["code"] == "server_shutting_down" and "shutting down" in error["message"]
    assert json.loads(short_chunks[-2])["choices"][0]["finish_reason"] == "length"
    assert server.ended_at_shutdown == 1
    wait_until(lambda: engine_idle(served.engine), what="the ended request's pages to be freed")


def _half_open(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # never the blank line that ends the headers
    return sock


def _closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes ``sock`` within ``within`` seconds (what it still sends is read over)."""
    deadline = time.monotonic() + within
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            if sock.recv(4096) == b"":
                return True
        except socket.timeout:
            return False
        except OSError:
            return True
    return False


def test_headers_that_never_end_and_idle_keep_alive_connections_are_closed(served) -> None:
    with beside(served, timeout_headers=0.5, timeout_keep_alive=0.5) as server:
        slow = _half_open(server.port)
        with httpx.Client(timeout=TIMEOUT_S) as client:  # keep-alive: one connection for both
            assert client.get(f"{server.url}/health").status_code == 200
            assert _closed_by_server(slow, 10)
        idle = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        idle.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert idle.recv(12) == b"HTTP/1.1 200"
        assert _closed_by_server(idle, 10)  # idle after its response
        assert server.guard.timed_out >= 1


def test_past_the_connection_cap_the_oldest_waiting_one_makes_room(served) -> None:
    with beside(served, max_connections=8, timeout_headers=60) as server:
        socks = [_half_open(server.port) for _ in range(30)]
        try:
            for _ in range(3):
                started = time.monotonic()
                assert httpx.get(f"{server.url}/health", timeout=TIMEOUT_S).status_code == 200
                assert time.monotonic() - started < 5
            assert server.guard.evicted >= 22 and len(server.guard.open) <= 8
            assert sum(_closed_by_server(s, 0.01) for s in socks[:20]) >= 15  # the oldest went first
        finally:
            for s in socks:
                s.close()
