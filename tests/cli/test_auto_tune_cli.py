"""``--auto-tune`` on the command line: off by default, refused where it has no meaning, bad values
are one line and exit 2, and a headless run with it on gives the tokens of a run without it."""

from __future__ import annotations

import dataclasses
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
from support.cli_support import ENGINE_ARGS, assert_usage_error, run

from graphtop.cli.auto_tune_flags import DEFAULTS
from graphtop.engine.auto_tune import AutoTuneConfig

pytestmark = pytest.mark.usefixtures("torch_one_thread", "private_cache_dir")


def test_the_flag_defaults_are_the_tuners() -> None:
    fields = {f.name: f.default for f in dataclasses.fields(AutoTuneConfig)}
    assert DEFAULTS == {
        "every": fields["every_s"],
        "min_interval": fields["min_interval_s"],
        "threshold": fields["threshold"],
        "window": fields["window"],
    }


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--auto-tune"], "--auto-tune is for headless runs"),
        (["--synthetic", "2", "--auto-tune-threshold", "1.5"], "--auto-tune-threshold"),
        (["--synthetic", "2", "--auto-tune-every", "nan"], "--auto-tune-every"),
        (["--synthetic", "2", "--auto-tune-max-graph-memory", "lots"], "--auto-tune-max-graph-memory"),
        (["serve", "--auto-tune-window", "2"], "--auto-tune-window"),
    ],
)
def test_bad_auto_tune_flags_are_one_line_exit_2(capsys, argv, needle) -> None:
    rc, out, err = run(capsys, *argv)
    assert_usage_error(rc, out, err, needle)


def test_a_headless_run_with_auto_tune_gives_the_same_tokens(tiny_ckpt, tmp_path, capsys) -> None:
    common = ["--model", tiny_ckpt("llama"), "--synthetic", 6, "--synthetic-prompt-len", "uniform:3:40"]
    common += ["--synthetic-output-len", "fixed:5", *ENGINE_ARGS]
    plain, tuned = tmp_path / "plain.jsonl", tmp_path / "tuned.jsonl"
    rc, _, err = run(capsys, *common, "--output", plain)
    assert rc == 0, err
    tune = ["--auto-tune", "--auto-tune-every", "0", "--auto-tune-min-interval", "0", "--auto-tune-threshold", "0"]
    rc, _, err = run(capsys, *common, *tune, "--output", tuned)
    assert rc == 0, err

    def tokens(path):
        return [json.loads(line)["token_ids"] for line in path.read_text().splitlines()]

    assert tokens(tuned) == tokens(plain)
