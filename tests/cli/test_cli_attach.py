"""``graphtop ps``, ``graphtop attach`` errors and ``--telemetry`` on the command line.

Engines here are TelemetryServers on a scripted bus (ps and attach only read the runtime folder and
talk to the endpoint), plus one real headless run with ``--telemetry`` as a subprocess. The full
attach in a terminal is in test_tui_tmux.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from graphtop.cli.entry import main
from graphtop.engine.telemetry.bus import EventBus
from graphtop.engine.telemetry.runtime import list_entries
from graphtop.engine.telemetry.server import EndpointConfig, TelemetryServer


@pytest.fixture
def runtime(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path_factory.mktemp("rt")
    monkeypatch.setenv("GRAPHTOP_RUNTIME_DIR", str(folder))
    return folder


@pytest.fixture
def servers(runtime: Path):
    made: list[TelemetryServer] = []

    def make(label: str = "/ckpt/Qwen3-0.6B", **kw) -> TelemetryServer:
        s = TelemetryServer(EventBus(), EndpointConfig(runtime_dir=runtime, label=label, **kw))
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def usage_error(rc: int, err: str, needle: str) -> None:
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith("graphtop: error:") and needle in err, err


def test_ps_lists_attachable_engines(capsys, runtime, servers) -> None:
    rc, out, _ = run(capsys, "ps")
    assert rc == 0 and "no attachable graphtop engines" in out
    a = servers()
    b = servers(label="demo model")
    rc, out, _ = run(capsys, "ps")
    lines = out.strip().splitlines()
    assert rc == 0 and lines[0].split() == ["PID", "MODEL", "DEVICE", "UPTIME", "ENDPOINT"]
    assert len(lines) == 3
    row = lines[1].split()
    assert row[0] == str(os.getpid()) and row[1] == "Qwen3-0.6B" and row[-1] == a.endpoint
    assert lines[2].endswith(b.endpoint) and "demo model" in lines[2]
    usage_error(*run(capsys, "ps", "extra")[::2], "takes no arguments")


def test_attach_errors_are_one_line(capsys, runtime, servers) -> None:
    usage_error(*run(capsys, "attach")[::2], "no running graphtop engine to attach to")
    usage_error(*run(capsys, "attach", "/no/such.sock")[::2], "no running graphtop engine at /no/such.sock")
    usage_error(*run(capsys, "attach", "tcp://127.0.0.1:9")[::2], "pass --token")
    usage_error(*run(capsys, "attach", "udp://x")[::2], "use ipc://PATH, tcp://HOST:PORT")
    for port in ("99999", "-1", "*"):  # ZeroMQ would reach port 34463 for 99999; * names no engine
        usage_error(*run(capsys, "attach", f"tcp://127.0.0.1:{port}", "--token", "t")[::2], "the port must be 1-65535")
    a = servers()
    usage_error(*run(capsys, "attach", str(os.getpid()), "--token", "wrong")[::2], "wrong token")
    servers()
    usage_error(*run(capsys, "attach")[::2], "2 engines are running; name one")
    assert a.refused == 1  # the wrong token was refused by the endpoint itself


def test_attach_resolves_pid_endpoint_and_socket_path(runtime, servers) -> None:
    from graphtop.cli.attach import resolve_endpoint

    a = servers()
    for name in (None, str(os.getpid()), a.endpoint, a.endpoint[len("ipc://") :]):
        assert resolve_endpoint(name, None)[:2] == (a.endpoint, a.token)
    assert resolve_endpoint(None, "given")[1] == "given"


def test_attach_matches_a_socket_path_written_another_way(runtime, servers, tmp_path, monkeypatch) -> None:
    """``./X.sock``, ``//`` in the path, a symbolic link and ``ipc://relative`` name a live engine's socket
    too: they were compared as typed and refused as "not an engine of this user"."""
    from graphtop.cli.attach import resolve_endpoint

    a = servers()
    sock = Path(a.endpoint[len("ipc://") :])
    link = tmp_path / "link.sock"
    link.symlink_to(sock)
    monkeypatch.chdir(sock.parent)
    for name in (f"./{sock.name}", f"{sock.parent}//{sock.name}", str(link), f"ipc://{sock.name}", f"ipc://{link}"):
        assert resolve_endpoint(name, None)[:2] == (a.endpoint, a.token), name


def test_replay_and_telemetry_do_not_mix(capsys, runtime, tmp_path: Path) -> None:
    usage_error(*run(capsys, "--replay", str(tmp_path / "t.jsonl"), "--telemetry")[::2], "no engine to serve")


def test_bad_telemetry_address_fails_before_the_model_loads(capsys, runtime, monkeypatch) -> None:
    import graphtop.cli.headless as headless

    monkeypatch.setattr(headless, "_load_engine", lambda *a: pytest.fail("the model must not load"))
    usage_error(*run(capsys, "--synthetic", "2", "--telemetry", "udp://x")[::2], "use ipc (the default) or tcp://")


def test_a_runtime_folder_open_to_others_is_refused_before_the_model_loads(capsys, runtime, monkeypatch) -> None:
    import graphtop.cli.headless as headless

    monkeypatch.setattr(headless, "_load_engine", lambda *a: pytest.fail("the model must not load"))
    os.chmod(runtime, 0o775)
    usage_error(
        *run(capsys, "--synthetic", "2", "--telemetry")[::2],
        f"runtime folder {runtime} is open to other users (mode 0775)",
    )
    assert oct(os.stat(runtime).st_mode & 0o777) == "0o775"  # left as the user made it


@pytest.mark.slow
def test_headless_run_serves_telemetry_and_cleans_up(tiny_ckpt, runtime: Path, tmp_path: Path) -> None:
    env = {**os.environ, "GRAPHTOP_RUNTIME_DIR": str(runtime), "HF_HUB_OFFLINE": "1"}
    argv = [
        sys.executable,
        "-m",
        "graphtop.cli.entry",
        "--model",
        str(tiny_ckpt("qwen3")),
        "--device",
        "cpu",
        "--max-total-tokens",
        "2048",
        "--max-running-requests",
        "4",
        "--chunked-prefill-size",
        "64",
        "--synthetic",
        "4",
        "--synthetic-output-len",
        "fixed:4",
        "--output",
        str(tmp_path / "out.jsonl"),
    ]
    proc = subprocess.run(argv + ["--telemetry"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^graphtop: telemetry on ipc://\S+\.sock — graphtop attach \d+$", proc.stderr, re.M), proc.stderr
    assert "token" not in proc.stderr  # a Unix socket needs none on the command line
    proc = subprocess.run(
        argv + ["--telemetry", "tcp://127.0.0.1:*"], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^graphtop: token \S{40,} \(kept 0600 in ", proc.stderr, re.M), proc.stderr
    assert list_entries(runtime) == [] and not list(runtime.iterdir())  # entry and socket removed


GOOD_ENTRY = dict(
    pid=os.getpid(), endpoint="ipc://x", token="t", model="m", device="d", started=time.time()
)  # after this process started: a later start is a reused pid


@pytest.mark.parametrize(
    "change",
    [
        dict(pid="abc"),
        dict(pid=1e3),
        dict(pid=10**20),
        dict(pid=0),
        dict(pid=-1),
        dict(pid=True),
        dict(endpoint=5),
        dict(model=7),
        dict(device=None),
        dict(started="x"),
        dict(started=float("nan")),
        dict(started=-1.0),
        dict(extra=1),
        "list",
        "null",
    ],
)
def test_ps_skips_entries_this_version_did_not_write(capsys, runtime, change) -> None:
    """An entry with a pid of the wrong type crashed ``ps`` with a traceback; pid 0 or -1 (a process
    group, every process for ``kill``) listed an engine that does not exist."""
    import json

    data = [] if change == "list" else None if change == "null" else {**GOOD_ENTRY, **change}
    (runtime / "1-1.json").write_text(json.dumps(data))
    assert list_entries(runtime) == []
    rc, out, err = run(capsys, "ps")
    assert rc == 0 and err == "" and "no attachable graphtop engines" in out


def test_ps_prints_entry_text_without_terminal_controls(capsys, runtime) -> None:
    import json

    (runtime / "1-1.json").write_text(
        json.dumps({**GOOD_ENTRY, "model": "m\nFORGED\u202e", "device": "\u2066cpu", "endpoint": "ipc://x\x1b[2J"})
    )
    rc, out, err = run(capsys, "ps")
    lines = out.strip().splitlines()
    assert rc == 0 and len(lines) == 2 and "\x1b" not in out and "\u202e" not in out and "\u2066" not in out
    assert "m FORGED\ufffd" in lines[1] and "\ufffdcpu" in lines[1] and lines[1].endswith("ipc://x\u241b[2J")


def test_ps_and_attach_skip_what_is_not_an_entry_file(capsys, runtime) -> None:
    """A FIFO named like an entry blocked ``ps`` and every ``attach`` forever; a link to /dev/zero
    read until memory ran out."""
    import json

    os.mkfifo(runtime / "1-0.json")
    (runtime / "2-0.json").symlink_to("/dev/zero")
    (runtime / "3-0.json").write_text(json.dumps(GOOD_ENTRY) + " " * (64 << 10))
    assert list_entries(runtime) == []
    rc, out, err = run(capsys, "ps")
    assert rc == 0 and "no attachable graphtop engines" in out


def test_error_lines_carry_no_terminal_controls() -> None:
    """A remote engine's refusal reason is quoted in the error: an ESC in it would reach the terminal."""
    from graphtop.engine.telemetry.plain_text import message_line

    line = message_line("refused this viewer: \x1b]0;PWNED\x07\x1b[2J\nevil")
    assert line == "refused this viewer: \u241b]0;PWNED\u2407\u241b[2J evil"
