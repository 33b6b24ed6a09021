"""``graphtop serve`` as a process, from start to SIGTERM: while the model loads ``/health`` answers 503 at
once and stdout says what loads, a line per phase; then 200 and an access log on stderr; on SIGTERM a short
request still finishes, the streams still running get a last error chunk and ``[DONE]``, and the process
exits 0 with no traceback. Loopback only; every wait is bounded."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import httpx
from support.serve_support import TIMEOUT_S
from test_serve_cli import SMALL

SLOW_LOAD_S = 3.0
SLOW_LOAD = (
    "import sys, time\n"
    "import graphtop.cli.headless as headless\n"
    "load = headless._load_engine\n"
    f"headless._load_engine = lambda *a: (time.sleep({SLOW_LOAD_S}), load(*a))[1]\n"
    "from graphtop.cli.entry import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)
"""``graphtop serve`` whose model takes a few seconds more to load: time to watch ``/health`` meanwhile."""
LONG = {"prompt": "Once", "max_tokens": 100_000, "ignore_eos": True, "temperature": 0, "stream": True}


def serve_env(demo_cache: Path) -> dict[str, str]:
    return {**os.environ, "GRAPHTOP_CACHE_DIR": str(demo_cache), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def lines_of(stream) -> "queue.Queue[str]":
    lines: "queue.Queue[str]" = queue.Queue()

    def read() -> None:
        for line in stream:
            lines.put(line.rstrip("\n"))

    threading.Thread(target=read, daemon=True).start()
    return lines


def wait_for(lines: "queue.Queue[str]", seen: list[str], found: Callable[[str], bool], timeout: float = 120) -> str:
    """The first line that ``found`` accepts (every line read goes into ``seen``)."""
    deadline = time.monotonic() + timeout
    while True:
        line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
        seen.append(line)
        if found(line):
            return line


def drain(lines: "queue.Queue[str]", seen: list[str]) -> list[str]:
    while not lines.empty():
        seen.append(lines.get())
    return seen


def stream(url: str, body: dict, chunks: list, first: threading.Event) -> None:
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=TIMEOUT_S) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                chunks.append(line[len("data: ") :])
                first.set()


def test_serve_from_loading_to_sigterm_mid_stream(demo_cache) -> None:
    argv = ["serve", "--port", "0", *SMALL, "--timeout-graceful-shutdown", "2"]
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_LOAD, *argv],
        env=serve_env(demo_cache),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = lines_of(proc.stdout), lines_of(proc.stderr)
    said: list[str] = []
    logged: list[str] = []
    clients: list[threading.Thread] = []
    try:
        loading = wait_for(out, said, lambda line: "answers 503 until it serves" in line)
        health = re.search(r"(http://127\.0\.0\.1:\d+)/health", loading).group(1)
        started = time.monotonic()
        early = httpx.get(f"{health}/health", timeout=TIMEOUT_S)
        assert time.monotonic() - started < SLOW_LOAD_S  # answered during the load, not after it
        assert early.status_code == 503 and early.json()["error"]["code"] == "model_loading"
        wait_for(out, said, lambda line: line.startswith("graphtop: ready in "))
        assert said[0].startswith("graphtop: loading the demo model")
        assert any(line.startswith("graphtop: loaded demo-qwen3-v1 on ") for line in said), said
        wait_for(err, logged, lambda line: "serving demo at" in line)
        url = health
        assert httpx.get(f"{url}/health", timeout=TIMEOUT_S).status_code == 200

        long_chunks: list[list[str]] = [[], []]
        short_chunks: list[str] = []
        firsts = [threading.Event() for _ in range(3)]
        clients = [threading.Thread(target=stream, args=(url, LONG, long_chunks[i], firsts[i])) for i in range(2)]
        short = {"prompt": "Hi", "max_tokens": 4, "temperature": 0, "stream": True}
        clients.append(threading.Thread(target=stream, args=(url, short, short_chunks, firsts[2])))
        for c in clients[:2]:
            c.start()
        assert all(f.wait(TIMEOUT_S) for f in firsts[:2])
        clients[2].start()
        assert firsts[2].wait(TIMEOUT_S)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(TIMEOUT_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for c in clients:
            c.join(TIMEOUT_S)
    for chunks in long_chunks:
        assert chunks[-1] == "[DONE]", chunks[-3:]
        assert json.loads(chunks[-2])["error"]["code"] == "server_shutting_down", chunks[-2]
    assert short_chunks[-1] == "[DONE]" and json.loads(short_chunks[-2])["choices"][0]["finish_reason"] == "length"
    time.sleep(0.2)  # the readers reach the pipes' ends
    logged = drain(err, logged)
    assert not [line for line in logged if "Traceback" in line or "Error" in line.split(" ", 1)[0]], logged
    assert any("GET /health 503 " in line and " WARNING " in line for line in logged), logged
    assert any("POST /v1/completions 200 " in line and "completion_tokens=4" in line for line in logged), logged
    assert any(line.startswith("graphtop: stopped (terminated); 2 request(s) did not finish") for line in logged)
