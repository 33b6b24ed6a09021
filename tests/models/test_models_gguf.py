"""GGUF paths that need no real model: every bad .gguf input is one CheckpointError line (CLI: exit 2),
and nothing half-converted is ever left in the cache."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import importlib.util

import pytest
from support.load_support import load_error, require_gguf_packages

from graphtop.cli.entry import main
from graphtop.models.checkpoint import gguf as gguf_mod


@pytest.fixture(autouse=True)
def private_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHTOP_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_missing_gguf_file(tmp_path):
    assert load_error(tmp_path / "nope.gguf") == f"GGUF file not found: {tmp_path / 'nope.gguf'}"


def test_gguf_link_loop_and_unknown_home_are_one_line(tmp_path, capsys):
    """pathlib raised a bare RuntimeError for both (a traceback, exit 1)."""
    (tmp_path / "loop.gguf").symlink_to("loop.gguf")
    assert (
        load_error(tmp_path / "loop.gguf") == f"GGUF file {tmp_path / 'loop.gguf'}: Too many levels of symbolic links"
    )
    assert load_error("~graphtop-nosuchuser/m.gguf").endswith(
        "cannot expand ~graphtop-nosuchuser (no such user or no home folder)"
    )
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    rc = main(
        [
            "--model",
            "~graphtop-nosuchuser/m.gguf",
            "--device",
            "cpu",
            "--prompts",
            str(prompts),
            "--output",
            str(tmp_path / "o.jsonl"),
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and err.count("\n") == 1 and "cannot expand ~graphtop-nosuchuser" in err


def test_gguf_named_folder_is_refused(tmp_path):
    (tmp_path / "odd.gguf").mkdir()
    assert load_error(tmp_path / "odd.gguf").startswith("GGUF path is not a file")


def test_garbage_gguf_is_one_line_and_leaves_no_cache_entry(tmp_path, private_cache_dir):
    require_gguf_packages()  # gguf-py's reader is what finds the file unreadable
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all" * 10)
    message = load_error(bad)
    assert message.startswith("GGUF metadata not readable by transformers") and str(bad) in message
    entries = list((private_cache_dir / "gguf").iterdir()) if (private_cache_dir / "gguf").exists() else []
    assert entries == []  # the staging folder is gone, no folder pretends to be a conversion


def test_missing_packages_name_the_extra(tmp_path, monkeypatch):
    bad = tmp_path / "m.gguf"
    bad.write_bytes(b"GGUF")
    real = importlib.util.find_spec
    monkeypatch.setattr(gguf_mod.importlib.util, "find_spec", lambda name: None if name == "gguf" else real(name))
    message = load_error(bad)
    assert "needs the package(s) gguf" in message and "graphtop[gguf]" in message


def test_cli_bad_gguf_is_usage_error(tmp_path, capsys):
    require_gguf_packages()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"\0" * 64)
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    rc = main(
        ["--model", str(bad), "--device", "cpu", "--prompts", str(prompts), "--output", str(tmp_path / "o.jsonl")]
    )
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert err.startswith("graphtop: error: GGUF metadata not readable") and err.count("\n") == 1


def test_cli_dashboard_accepts_a_gguf_file_but_not_other_files(tmp_path, capsys, monkeypatch):
    from graphtop.cli import launch

    seen = []
    monkeypatch.setattr(launch, "run_interactive", lambda model, *a, **k: seen.append(model) or 0)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    assert main(["--model", str(model)]) == 0 and seen == [str(model)]
    other = tmp_path / "m.bin"
    other.write_bytes(b"x")
    assert main(["--model", str(other)]) == 2
    assert "is not a folder (nor a .gguf file)" in capsys.readouterr().err
