"""``--parity-every N`` from the command line: a recorded run's parity checks in ``trace summary``, and
bad values as one-line errors."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from graphtop.cli.entry import main
from graphtop.engine.telemetry import events as ev
from graphtop.engine.trace_tools.trace import read_trace

pytestmark = pytest.mark.usefixtures("torch_one_thread")

ENGINE_ARGS = [
    "--device",
    "cpu",
    "--max-total-tokens",
    "2048",
    "--max-running-requests",
    "4",
    "--chunked-prefill-size",
    "64",
    "--cuda-graph-bs-decode",
    "1,2,4",
]


def test_recorded_parity_checks_in_the_trace_summary(tiny_ckpt, tmp_path, capsys) -> None:
    trace = tmp_path / "run.jsonl"
    rc = main(
        [
            "--model",
            str(tiny_ckpt("llama")),
            "--synthetic",
            "4",
            "--synthetic-prompt-len",
            "uniform:4:40",
            "--synthetic-output-len",
            "fixed:12",
            "--record",
            str(trace),
            "--parity-every",
            "2",
            # checks start once every graph is live: captured first, a loaded runner still has steps to check
            "--capture-before-serving",
            *ENGINE_ARGS,
        ]
    )
    assert rc == 0, capsys.readouterr().err
    capsys.readouterr()
    checks = [e for e in read_trace(trace).events if isinstance(e, ev.ParityCheck)]
    assert checks and all(c.every == 2 and not c.mismatch for c in checks)
    assert main(["trace", "summary", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "Parity checks (graph step vs its eager re-run, one graph step in 2): all agree" in out
    assert f"checks {len(checks)}  mismatches 0" in out


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--parity-every", "-1"], "must be >= 0"),
        (["--parity-every", "x"], "is not an integer"),
        (["--parity-tolerance", "0"], "must be positive"),
    ],
)
def test_bad_parity_options_are_one_line_exit_2(tmp_path, capsys, args, needle) -> None:
    rc = main(["--synthetic", "1", "--output", str(tmp_path / "o.jsonl"), *args])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("graphtop: error: ") and needle in err and err.count("\n") == 1
