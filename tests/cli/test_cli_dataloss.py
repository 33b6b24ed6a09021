"""Bad input and interrupted or failing runs on the command line: one line, a non-zero exit, and no
lost or half-written files (the demo model's cache, --output, --record)."""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.cli_support import SHORT_RUN, assert_usage_error, console_script, run

from graphtop.models import CheckpointError
from graphtop.models.synthetic import demo

pytestmark = pytest.mark.usefixtures("private_cache_dir")


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("hello world\nonce upon a time\n")
    return path


# --- the demo model's cache ------------------------------------------------------------------------


def test_a_cache_dir_under_an_unknown_user_is_one_line_exit_2(tmp_path, prompts, capsys, monkeypatch):
    monkeypatch.setenv("GRAPHTOP_CACHE_DIR", "~graphtop-no-such-user/cache")
    rc, _, err = run(capsys, "--prompts", prompts, "--output", tmp_path / "o.jsonl", "--device", "cpu")
    assert_usage_error(
        rc, "", err, "GRAPHTOP_CACHE_DIR=~graphtop-no-such-user/cache", "cannot expand ~graphtop-no-such-user"
    )
    assert not (tmp_path / "o.jsonl").exists()


def test_a_disk_that_fills_while_the_weights_are_saved_leaves_no_files(tmp_path, monkeypatch):
    import transformers.modeling_utils as modeling_utils
    from safetensors import SafetensorError

    def full_disk(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"half a file")
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(modeling_utils, "safe_save_file", full_disk)
    cache = tmp_path / "cache"
    with pytest.raises(CheckpointError) as info:
        demo.ensure_demo_model(cache)
    assert str(info.value) == (
        f"cache folder {cache}: cannot build the demo model: "
        "Error while serializing: I/O error: No space left on device (os error 28)"
    )
    assert list(cache.iterdir()) == []  # neither the staging folder nor a half-built model


# --- headless runs: outputs that fail, interrupted runs --------------------------------------------


@pytest.fixture(scope="module")
def ckpt(tiny_ckpt):
    return tiny_ckpt("llama")


def _lines(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def _graphtop(*argv, **popen):
    """The console script, as a user runs it (signals and FIFOs need a process of its own)."""
    script = console_script()
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    return subprocess.Popen(
        [str(script), *map(str, argv)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **popen
    )


@pytest.fixture
def full_device():
    if not (os.path.exists("/dev/full") and stat.S_ISCHR(os.stat("/dev/full").st_mode)):
        pytest.skip("no /dev/full here")
    return "/dev/full"


def test_an_output_that_cannot_be_written_is_one_line_exit_2(ckpt, prompts, full_device, capsys):
    rc, out, err = run(capsys, "--model", ckpt, "--prompts", prompts, "--output", full_device, *SHORT_RUN)
    assert rc == 2
    assert err.splitlines() == ["graphtop: error: cannot write /dev/full: No space left on device"]
    assert out.startswith("requests 2 (0 failed)")  # the run itself is still reported


def _trace_writes_fail(monkeypatch):
    """Every event batch after the header fails as a full disk does."""
    from graphtop.engine.telemetry import recorder

    def full_disk(events):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(recorder, "encode_lines", full_disk)


def test_a_trace_that_fails_mid_run_exits_2_and_the_results_are_kept(ckpt, prompts, tmp_path, capsys, monkeypatch):
    _trace_writes_fail(monkeypatch)
    out_file, trace = tmp_path / "out.jsonl", tmp_path / "t.jsonl"
    rc, out, err = run(
        capsys, "--model", ckpt, "--prompts", prompts, "--output", out_file, "--record", trace, *SHORT_RUN
    )
    assert rc == 2
    [line] = err.splitlines()
    assert line.startswith(f"graphtop: error: cannot write trace {trace}: ENOSPC: No space left on device (")
    assert "WRITE FAILED" in out and "graphtop trace summary" not in out  # no summary of a partial trace
    assert [r["prompt"] for r in _lines(out_file)] == ["hello world", "once upon a time"]


def test_a_failed_trace_and_a_failed_output_are_both_reported(
    ckpt, prompts, tmp_path, full_device, capsys, monkeypatch
):
    _trace_writes_fail(monkeypatch)
    trace = tmp_path / "t.jsonl"
    rc, _, err = run(
        capsys, "--model", ckpt, "--prompts", prompts, "--output", full_device, "--record", trace, *SHORT_RUN
    )
    assert rc == 2
    lines = err.splitlines()
    assert lines[0] == "graphtop: error: cannot write /dev/full: No space left on device"
    assert lines[1].startswith(f"graphtop: error: cannot write trace {trace}: ENOSPC") and len(lines) == 2


def test_a_trace_replaced_while_recording_exits_2_and_the_other_file_is_kept(
    ckpt, prompts, tmp_path, capsys, monkeypatch
):
    from graphtop.cli import headless

    trace, other = tmp_path / "t.jsonl", tmp_path / "other.jsonl"
    other.write_text("another run's trace\n")
    serve = headless._serve

    def serve_then_be_replaced(*a):
        served = serve(*a)
        os.replace(other, trace)  # what a second run's rename does
        return served

    monkeypatch.setattr(headless, "_serve", serve_then_be_replaced)
    rc, out, err = run(
        capsys, "--model", ckpt, "--prompts", prompts, "--output", tmp_path / "o.jsonl", "--record", trace, *SHORT_RUN
    )
    assert rc == 2
    [line] = err.splitlines()
    assert line.startswith(f"graphtop: error: cannot write trace {trace}: another file replaced it while recording")
    assert trace.read_text() == "another run's trace\n" and "graphtop trace summary" not in out


def _signal_during_step(monkeypatch, signum, steps):
    """Send ``signum`` to this process half-way through the engine's ``steps``-th step (its forward done,
    the step not yet over), as a user's Ctrl-C or kill mostly lands."""
    from graphtop.engine.step.loop import StepLoop

    real_step = StepLoop.step
    count = [0]

    def step(self):
        done = real_step(self)
        count[0] += 1
        if count[0] == steps:
            os.kill(os.getpid(), signum)
        return done

    monkeypatch.setattr(StepLoop, "step", step)


@pytest.mark.parametrize(
    "signum,word,status", [(signal.SIGINT, "interrupted", 130), (signal.SIGTERM, "terminated", 143)]
)
def test_an_interrupted_run_writes_the_results_finished_so_far(
    ckpt, tmp_path, capsys, monkeypatch, signum, word, status
):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "\n".join(
            json.dumps({"prompt": p, "max_new_tokens": n, "ignore_eos": True, "id": i})
            for p, n, i in [("hello", 1, "short"), ("once upon a time", 100, "long")]
        )
        + "\n"
    )
    out_file, trace = tmp_path / "out.jsonl", tmp_path / "t.jsonl"
    _signal_during_step(monkeypatch, signum, 4)  # the short request has finished, the long one has not
    rc, _, err = run(
        capsys,
        "--model",
        ckpt,
        "--prompts",
        prompts,
        "--output",
        out_file,
        "--record",
        trace,
        "--disable-cuda-graph",
        *SHORT_RUN,
    )
    assert rc == status
    assert err.splitlines() == [f"graphtop: {word}: 1 of 2 results written to {out_file}; trace {trace} kept"]
    [short] = _lines(out_file)
    assert short["id"] == "short" and short["finish_reason"] == "length" and len(short["token_ids"]) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl", "p.jsonl", "t.jsonl"]


def test_an_interrupt_before_anything_finished_keeps_the_older_output(ckpt, prompts, tmp_path, capsys, monkeypatch):
    out_file = tmp_path / "out.jsonl"
    out_file.write_text("older results\n")
    _signal_during_step(monkeypatch, signal.SIGINT, 1)
    rc, _, err = run(
        capsys, "--model", ckpt, "--prompts", prompts, "--output", out_file, "--disable-cuda-graph", *SHORT_RUN
    )
    assert rc == 130
    assert err.splitlines() == [f"graphtop: interrupted: no request had finished; {out_file} left as it was"]
    assert out_file.read_text() == "older results\n"


def _staged_header_written(folder):
    """A staged trace holds its header (an empty .tmp is the path's probe, removed at once)."""
    for p in folder.glob(".*.tmp"):
        try:
            if p.stat().st_size:
                return True
        except FileNotFoundError:
            pass
    return False


def test_sigterm_while_the_model_loads_leaves_no_temporary_file(ckpt, prompts, tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("an older trace\n")
    proc = _graphtop(
        "--model", ckpt, "--prompts", prompts, "--output", tmp_path / "o.jsonl", "--record", trace, *SHORT_RUN
    )
    try:
        deadline = time.monotonic() + 60
        while not _staged_header_written(tmp_path):  # the model loads now
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    assert err.splitlines() == ["graphtop: terminated"] and out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prompts.txt", "t.jsonl"]
    assert trace.read_text() == "an older trace\n"


_MORE_SIGTERMS = """
import atexit, os, signal, sys, time
from graphtop.engine.engine import Engine
from graphtop.engine.step.loop import StepLoop
from graphtop.cli.entry import main

def kill_me():
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.05)  # the signal is delivered before this returns

real_step, real_close = StepLoop.step, Engine.close
StepLoop.step = lambda self: (kill_me(), real_step(self))[1]  # the first SIGTERM: while serving
Engine.close = lambda self, *a, **k: (kill_me(), real_close(self, *a, **k))[1]  # during the clean-up
atexit.register(kill_me)  # after main returned, while the interpreter shuts down
sys.exit(main(sys.argv[1:]))
"""


def test_more_sigterms_during_the_clean_up_still_exit_143(ckpt, prompts, tmp_path):
    """A second SIGTERM once the CLI had returned (the handler put back) ended the process by the signal."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    out_file = tmp_path / "o.jsonl"
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _MORE_SIGTERMS,
            "--model",
            str(ckpt),
            "--prompts",
            str(prompts),
            "--output",
            str(out_file),
            *SHORT_RUN,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 143, proc.stderr
    assert proc.stderr.splitlines() == [f"graphtop: terminated: no request had finished; {out_file} left as it was"]


def test_a_trace_recorded_into_a_fifo_is_not_read_back(ckpt, prompts, tmp_path):
    """The summary re-reads a trace file; a FIFO (or /dev/stdout into a pipe) has nothing to re-read and
    reading it waited forever."""
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    proc = _graphtop("--model", ckpt, "--prompts", prompts, "--record", fifo, *SHORT_RUN)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    reader.join(10)
    assert proc.returncode == 0, err
    assert f"trace {fifo}:" in out and "graphtop trace summary" not in out
    assert json.loads(received[0].splitlines()[0])["type"] == "header"
