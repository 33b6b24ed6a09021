"""Standard output that cannot be written: one line for a full disk, silence for a reader that left.

Both ran into a Python traceback (exit 1) after every file the command wrote was already written."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from support.cli_support import SHORT_RUN, console_script, run


@pytest.fixture(scope="module")
def trace(tmp_path_factory, tiny_ckpt) -> Path:
    from graphtop.cli.entry import main

    path = tmp_path_factory.mktemp("stdout") / "t.jsonl"
    assert (
        main(
            [
                "--model",
                str(tiny_ckpt("llama")),
                "--synthetic",
                "3",
                "--synthetic-prompt-len",
                "fixed:8",
                "--synthetic-output-len",
                "fixed:3",
                "--record",
                str(path),
                *SHORT_RUN,
            ]
        )
        == 0
    )
    return path


def _graphtop(*args: object, stdout) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run(
        [str(console_script()), *map(str, args)], stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=300, env=env
    )


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("argv", [("trace", "summary"), ("advise",), ("trace", "export", "--perfetto")])
def test_a_full_stdout_is_one_line_exit_2(trace, tmp_path, argv):
    extra = [tmp_path / "out.json"] if "export" in argv else []
    with open("/dev/full", "w") as full:
        proc = _graphtop(*argv, trace, *extra, stdout=full)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == ["graphtop: error: cannot write to standard output: No space left on device"]
    if extra:
        assert extra[0].stat().st_size > 0  # the file it was asked for is written all the same


def test_a_reader_that_left_ends_quietly(trace):
    proc = subprocess.Popen(
        [str(console_script()), "trace", "summary", str(trace)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
    )
    proc.stdout.close()  # before it writes: `graphtop trace summary T | head -0`
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1 and err == b""


def test_in_process_the_stream_is_restored(trace, capsys):
    import sys

    before = sys.stdout
    rc, out, _ = run(capsys, "trace", "summary", trace)
    assert rc == 0 and "graphtop trace summary" in out and sys.stdout is before
