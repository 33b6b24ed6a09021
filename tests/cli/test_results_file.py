"""An interrupt while --output is being opened (SIGTERM as the run starts) leaves no staged file."""

from __future__ import annotations

import os

import pytest

from graphtop.cli.results_file import ResultsFile
from graphtop.engine.telemetry import safe_write


def _interrupt(*_a, **_k):
    raise KeyboardInterrupt


@pytest.mark.parametrize("where", ["after-staging", "inside-staging"])
def test_an_interrupted_open_leaves_no_temporary_file(tmp_path, monkeypatch, where):
    out = tmp_path / "o.jsonl"
    out.write_text("an older result\n")
    if where == "after-staging":
        monkeypatch.setattr(os, "fstat", _interrupt)
    else:
        monkeypatch.setattr(safe_write.os, "fdopen", _interrupt)
    results = ResultsFile(str(out))
    with pytest.raises(KeyboardInterrupt):
        results.open()
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.jsonl"]  # the open cleaned up after itself
    assert results.finish(None) is None  # the run's clean-up, again: nothing left to do
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.jsonl"]
    assert out.read_text() == "an older result\n"
