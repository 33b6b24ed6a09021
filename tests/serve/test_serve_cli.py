"""``graphtop serve`` and the dashboard's ``--serve``: usage errors are one line before any model loads, and
the loop closes: a trace recorded from served traffic gives a bucket list (``graphtop advise``) that
``--cuda-graph-config`` takes back and the engine captures."""

from __future__ import annotations

import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from support.cli_support import assert_usage_error, run
from support.serve_support import TIMEOUT_S

from graphtop.cli.flags import engine_config_from_args
from graphtop.cli.serve import build_serve_parser
from graphtop.engine.engine import Engine
from graphtop.server.options import ServeOptions, exposure_warning, is_loopback

SMALL = [
    "--device",
    "cpu",
    "--max-total-tokens",
    "4096",
    "--max-running-requests",
    "8",
    "--chunked-prefill-size",
    "64",
    "--cuda-graph-bs-decode",
    "1,2,4,8",
    "--cuda-graph-num-tokens-prefill",
    "16,32,64",
]


@pytest.fixture
def busy_port():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    yield sock.getsockname()[1]
    sock.close()


@pytest.fixture
def no_model_load(monkeypatch):
    """The usage errors here come before a model would load."""
    import graphtop.cli.headless as headless

    monkeypatch.setattr(headless, "_load_engine", lambda *a: pytest.fail("the model must not load"))


def test_a_port_in_use_is_one_line_before_the_model_loads(
    capsys, busy_port, tmp_path, monkeypatch, no_model_load
) -> None:
    monkeypatch.setenv("GRAPHTOP_CACHE_DIR", str(tmp_path))
    assert_usage_error(
        *run(capsys, "serve", "--model", tmp_path, "--port", busy_port), f"cannot listen on 127.0.0.1:{busy_port}"
    )


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["serve", "--port", "70000"], "argument --port"),
        (["serve", "--api-key", ""], "an empty API key"),
        (["serve", "--max-queued-requests", "-1"], "argument --max-queued-requests"),
        (["serve", "--host", "no.such.host.invalid", "--port", "0"], "cannot listen on no.such.host.invalid:0"),
        (["--serve", "port"], "argument --serve"),
        (["--serve", "::1:80"], "IPv6 host in brackets"),
        (["--serve", "8000", "--synthetic", "2"], "--serve goes with the dashboard"),
        (["--replay", "run.jsonl", "--serve", "8000"], "no engine to serve with --serve"),
    ],
)
def test_serve_usage_errors_are_one_line(capsys, tmp_path, monkeypatch, no_model_load, argv, needle) -> None:
    monkeypatch.setenv("GRAPHTOP_CACHE_DIR", str(tmp_path))
    extra = ["--model", str(tmp_path)] if argv[0] == "serve" else []
    assert_usage_error(*run(capsys, *argv, *extra), needle)


@pytest.mark.parametrize(
    "argv, names, aliases",
    [
        (["m"], "m", ()),
        (["m", "--served-model-name", "a"], "a", ()),
        (["m", "--served-model-name", "a", "b", "org/c"], "a", ("b", "org/c")),
        (["--served-model-name", "a", "b", "--model", "m"], "a", ("b",)),
    ],
)
def test_served_model_names_as_vllm_takes_them(argv, names, aliases) -> None:
    from graphtop.cli.serve import read_serve_args, serve_options

    options = serve_options(read_serve_args(argv))
    assert (options.model_name, options.model_aliases, options.model_root) == (names, aliases, "m")


def test_a_model_read_as_a_served_name_or_a_name_given_twice_is_one_line(capsys, tmp_path, no_model_load) -> None:
    """``--served-model-name a PATH`` takes PATH as a second name (as vLLM's flag does): with no model given
    otherwise, that is refused, not the demo model served under two names."""
    line = assert_usage_error(*run(capsys, "serve", "--served-model-name", "a", tmp_path))
    assert f"--served-model-name took {tmp_path} as a name" in line
    line = assert_usage_error(*run(capsys, "serve", tmp_path, "--served-model-name", "a", "b", "a"))
    assert "'a' is given twice" in line


def test_the_serve_command_line_is_read_without_importing_the_http_stack() -> None:
    code = (
        "import sys; from graphtop.cli.serve import build_serve_parser; build_serve_parser();"
        "print(sorted(m for m in ('fastapi', 'uvicorn', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_reachable_address_without_a_key_is_warned_about(capsys, tmp_path) -> None:
    rc, _, err = run(capsys, "serve", "--host", "0.0.0.0", "--port", "0", "--model", tmp_path / "absent")
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 2 and "not found" in lines[1]  # the load fails after the warning
    assert lines[0].startswith("graphtop: warning: serving on 0.0.0.0 without --api-key")
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost") and not is_loopback("0.0.0.0")
    assert exposure_warning(ServeOptions(host="0.0.0.0", api_key="k")) is None
    assert exposure_warning(ServeOptions()) is None


def test_the_dashboards_serve_starts_the_api_beside_the_engine(demo_model, tmp_path, monkeypatch) -> None:
    """The engine the dashboard builds (launch._load_engine) serves the API once it runs."""
    from graphtop.cli.endpoint import open_endpoint
    from graphtop.cli.launch import _ApiBeside, _load_engine
    from graphtop.engine.telemetry.bus import EventBus

    monkeypatch.setenv("GRAPHTOP_RUNTIME_DIR", str(tmp_path / "runtime"))
    os.makedirs(tmp_path / "runtime", mode=0o700)
    api = _ApiBeside(ServeOptions(port=0, model_name="demo"))
    bus = EventBus()
    endpoint = open_endpoint(bus, "ipc", "test", say_where=False)
    api.subscribe(bus)
    holder: dict = {}
    args = build_serve_parser().parse_args(SMALL)
    _load_engine(str(demo_model), engine_config_from_args(args), bus, endpoint, holder, api)
    try:
        url = api.server.url
        r = httpx.post(
            f"{url}/v1/completions", json={"prompt": "Hi", "max_tokens": 3, "ignore_eos": True}, timeout=TIMEOUT_S
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        assert "graphtop:graph_capture_seconds" in httpx.get(f"{url}/metrics", timeout=TIMEOUT_S).text
    finally:
        api.close()
        holder["engine"].close()
        endpoint.close("test over")


def _read_lines(stream, lines: "queue.Queue[str]") -> None:
    for line in stream:
        lines.put(line)


def test_served_traffic_gives_a_trace_that_advise_turns_into_a_graph_config(
    demo_cache, tmp_path, capsys, monkeypatch
) -> None:
    trace = tmp_path / "served.jsonl"
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    env = {
        **os.environ,
        "GRAPHTOP_CACHE_DIR": str(demo_cache),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "GRAPHTOP_RUNTIME_DIR": str(runtime),
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "graphtop.cli.entry",
            "serve",
            "--port",
            "0",
            *SMALL,
            "--record",
            str(trace),
            "--telemetry",
        ],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    lines: "queue.Queue[str]" = queue.Queue()
    threading.Thread(target=_read_lines, args=(proc.stderr, lines), daemon=True).start()
    try:
        said, before = "", []
        while "serving" not in said:
            said = lines.get(timeout=120)
            before.append(said)
        assert any(line.startswith("graphtop: telemetry on ipc://") for line in before), before  # graphtop attach
        assert len(list(runtime.glob("*.json"))) == 1  # graphtop ps lists it
        url = re.search(r"at (http://127\.0\.0\.1:\d+)/v1 ", said).group(1)
        with httpx.Client(base_url=url, timeout=TIMEOUT_S) as client:
            for i, prompt in enumerate(["Hi", "The cat sat on the mat and looked around the room", "Hello there"]):
                body = {"prompt": prompt, "max_tokens": 4 + i, "temperature": 0}
                assert client.post("/v1/completions", json=body).status_code == 200
            chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
            assert client.post("/v1/chat/completions", json=chat).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(TIMEOUT_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    rest = []
    while not lines.empty():
        rest.append(lines.get())
    assert any(line.startswith(f"graphtop: stopped (terminated); trace {trace}: ") for line in rest), rest

    monkeypatch.undo()  # advise reads the trace only
    rc, out, err = run(capsys, "advise", trace)
    assert rc == 0 and err == "", err
    flag = next(line for line in out.splitlines() if line.startswith("--cuda-graph-config "))
    _, config_json = shlex.split(flag)
    args = build_serve_parser().parse_args([*SMALL, "--cuda-graph-config", config_json])
    config = engine_config_from_args(args)
    advised = config.graphs
    engine = Engine.from_pretrained(Path(demo_cache) / "demo-qwen3-v1", config=config)
    try:
        assert engine.wait_for_capture(TIMEOUT_S)
        assert engine.decode_buckets == advised.decode_bs and engine.decode_buckets
        assert engine.prefill_buckets == (advised.prefill_num_tokens or [])
    finally:
        engine.close()
