"""Output paths on the command line: refused when they would destroy an input, another output, a link
or a device node; written atomically (mode kept) otherwise. Refusals happen before the model loads."""

from __future__ import annotations

import json
import os
import stat

import pytest
from support.cli_support import SHORT_RUN, assert_usage_error, run

pytestmark = pytest.mark.usefixtures("torch_one_thread", "private_cache_dir")


@pytest.fixture(scope="module")
def ckpt(tiny_ckpt):
    return tiny_ckpt("llama")


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("hello world\nonce upon a time\n")
    return path


def test_output_over_the_prompts_file_is_refused(ckpt, prompts, capsys):
    before = prompts.read_bytes()
    rc, _, err = run(capsys, "--model", ckpt, "--prompts", prompts, "--output", prompts, *SHORT_RUN)
    assert_usage_error(rc, "", err, "--output", "same file as --prompts")
    assert prompts.read_bytes() == before


def test_output_through_a_link_to_the_prompts_file_is_refused(ckpt, prompts, tmp_path, capsys):
    link = tmp_path / "out.jsonl"
    link.symlink_to(prompts)
    rc, _, err = run(capsys, "--model", ckpt, "--prompts", prompts, "--output", link, *SHORT_RUN)
    assert_usage_error(rc, "", err, "--output")
    assert link.is_symlink() and prompts.read_text() == "hello world\nonce upon a time\n"


def test_record_and_output_on_one_file_are_refused(ckpt, prompts, tmp_path, capsys):
    same = tmp_path / "same.jsonl"
    same.write_text("an old trace\n")
    rc, _, err = run(capsys, "--model", ckpt, "--prompts", prompts, "--output", same, "--record", same, *SHORT_RUN)
    assert_usage_error(rc, "", err, "name the same file")
    assert same.read_text() == "an old trace\n"


def test_record_over_the_prompts_file_is_refused(ckpt, prompts, capsys):
    rc, _, err = run(capsys, "--model", ckpt, "--prompts", prompts, "--record", prompts, *SHORT_RUN)
    assert_usage_error(rc, "", err, "--record", "same file as --prompts")
    assert prompts.read_text() == "hello world\nonce upon a time\n"


def test_symlink_output_is_refused_and_kept(ckpt, prompts, tmp_path, capsys):
    real = tmp_path / "results.jsonl"
    real.write_text("old results\n")
    link = tmp_path / "latest.jsonl"
    link.symlink_to(real)
    for flag in ("--output", "--record"):
        rc, _, err = run(capsys, "--model", ckpt, "--prompts", prompts, flag, link, *SHORT_RUN)
        assert_usage_error(rc, "", err, flag, "symbolic link")
        assert link.is_symlink() and real.read_text() == "old results\n"


def test_device_output_is_written_through_and_an_existing_file_keeps_its_mode(ckpt, prompts, tmp_path, capsys):
    rc, out, err = run(capsys, "--model", ckpt, "--prompts", prompts, "--output", os.devnull, *SHORT_RUN)
    assert rc == 0 and err == "" and stat.S_ISCHR(os.stat(os.devnull).st_mode)
    target = tmp_path / "out.jsonl"
    target.write_text("old\n")
    target.chmod(0o640)
    rc, out, err = run(capsys, "--model", ckpt, "--prompts", prompts, "--output", target, *SHORT_RUN)
    assert rc == 0, err
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert [json.loads(line)["prompt"] for line in target.read_text().splitlines()] == [
        "hello world",
        "once upon a time",
    ]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary left


def test_perfetto_export_over_its_own_trace_is_refused(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        json.dumps({"type": "header", "ts": 1.0, "schema_version": 1, "graphtop_version": "0.1.0", "meta": {}}) + "\n"
    )
    before = trace.read_bytes()
    rc, _, err = run(capsys, "trace", "export", "--perfetto", trace, trace)
    assert_usage_error(rc, "", err, "OUT", "same file as TRACE")
    assert trace.read_bytes() == before


def test_perfetto_export_of_a_bad_trace_leaves_out_untouched(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        json.dumps({"type": "header", "ts": 1.0, "schema_version": 1, "graphtop_version": "0.1.0", "meta": {}})
        + "\n"
        + '{"type": "error", "ts": NaN, "message": "", "where": "", '
        '"fatal": false}\n'
    )
    out = tmp_path / "out.json"
    out.write_text("previous export")
    rc, _, err = run(capsys, "trace", "export", "--perfetto", trace, out)
    assert_usage_error(rc, "", err, f"{trace}:2:")
    assert out.read_text() == "previous export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "t.jsonl"]
