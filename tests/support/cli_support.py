"""Shared pieces of the command-line tests: a small CPU engine's flags, an in-process run, the one-line
usage-error check, and a private demo-model cache (a helper module, not a conftest)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from graphtop.cli.entry import main

# Small engine: no 512 MiB CPU pool, few buckets to capture.
ENGINE_ARGS = [
    "--device",
    "cpu",
    "--max-total-tokens",
    "2048",
    "--max-running-requests",
    "4",
    "--chunked-prefill-size",
    "64",
]
SHORT_RUN = [*ENGINE_ARGS, "--max-new-tokens", "3"]


@pytest.fixture
def private_cache_dir(tmp_path, monkeypatch):
    """Anything that falls back to the demo model builds it in a temp folder, never the user's cache."""
    monkeypatch.setenv("GRAPHTOP_CACHE_DIR", str(tmp_path / "graphtop-cache"))


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_usage_error(rc, out, err, *needles):
    """Exit 2, nothing on stdout, one ``graphtop: error:`` line on stderr holding every needle."""
    lines = err.strip().splitlines()
    assert rc == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith("graphtop: error: ") and "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert out == ""
    return lines[0]


def console_script() -> Path:
    """The installed ``graphtop`` console script, as a user runs it; the test skips where there is none."""
    script = Path(sys.executable).with_name("graphtop")
    if script.exists():
        return script
    found = shutil.which("graphtop")
    if found is None:
        pytest.skip("the graphtop console script is not installed")
    return Path(found)
