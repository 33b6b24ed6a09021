"""``graphtop web`` and ``graphtop serve --dashboard`` on the command line: one-line errors before anything
loads, and ``graphtop web`` following a scripted engine's endpoint from start to end."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from support.cli_support import assert_usage_error, run

from graphtop.engine.telemetry.bus import EventBus
from graphtop.engine.telemetry.server import EndpointConfig, TelemetryServer


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "rt"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("GRAPHTOP_RUNTIME_DIR", str(folder))
    return folder


@pytest.fixture
def busy_port():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    yield sock.getsockname()[1]
    sock.close()


def test_web_errors_are_one_line(capsys, runtime: Path, busy_port: int) -> None:
    assert_usage_error(*run(capsys, "web"), "no running graphtop engine to attach to")
    assert_usage_error(*run(capsys, "web", "tcp://127.0.0.1:9"), "pass --token")
    server = TelemetryServer(EventBus(), EndpointConfig(runtime_dir=runtime, label="scripted"))
    try:
        assert_usage_error(*run(capsys, "web", "--port", str(busy_port)), f"cannot listen on 127.0.0.1:{busy_port}")
        assert_usage_error(*run(capsys, "web", "--theme", "no-such-theme"), "unknown theme 'no-such-theme'")
        assert_usage_error(*run(capsys, "web", "--max-tabs", "0"), "--max-tabs")
    finally:
        server.close()


def test_serve_dashboard_on_a_port_in_use_fails_before_loading(capsys, runtime, busy_port, private_cache_dir) -> None:
    rc, out, err = run(capsys, "serve", "--port", "0", "--dashboard", f"127.0.0.1:{busy_port}")
    assert_usage_error(rc, out, err, f"cannot listen on 127.0.0.1:{busy_port}")
    assert "loading" not in err


def test_web_serves_an_engine_until_its_endpoint_closes(runtime: Path) -> None:
    server = TelemetryServer(EventBus(), EndpointConfig(runtime_dir=runtime, label="/ckpt/Qwen3-0.6B"))
    env = {**os.environ, "GRAPHTOP_RUNTIME_DIR": str(runtime)}
    # normal priority: what the server does is checked here, beside any CPU load (tests/cli/test_priority.py
    # checks the idle default)
    argv = [sys.executable, "-m", "graphtop.cli.entry", "web", str(os.getpid()), "--port", "0", "--priority", "normal"]
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        url = re.search(r"dashboard for browsers at (http://127\.0\.0\.1:\d+/)$", first.strip())
        assert url, first
        page = urllib.request.urlopen(url.group(1), timeout=10).read().decode()
        assert "<title>graphtop · Qwen3-0.6B</title>" in page
        with pytest.raises(urllib.error.HTTPError) as refused:  # another site's name for this machine
            urllib.request.urlopen(urllib.request.Request(url.group(1), headers={"Host": "evil.example"}), timeout=10)
        assert refused.value.code == 403
        server.close()
        assert proc.wait(30) == 1
        rest = proc.stderr.read()
        assert f"graphtop: the engine at {server.endpoint} is gone; web dashboard stopped" in rest
    finally:
        server.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
