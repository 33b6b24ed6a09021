"""bench/long_run_bench.py runs end to end on CPU: a headless round and a round with a viewer attached
from another process, and a report whose figures are all there."""

from __future__ import annotations

import json

import long_run_bench  # noqa: E402  (bench/ is on pytest's pythonpath)


def test_the_long_run_benchmark_runs_headless_and_attached_on_cpu(tmp_path, capsys, torch_one_thread) -> None:
    out = tmp_path / "long.json"
    argv = ["--device", "cpu", "--bs", "2", "--steps", "40", "--rounds", "2", "--prompt-len", "16", "--json", str(out)]
    assert long_run_bench.main(argv) == 0
    [result] = json.loads(out.read_text())
    assert result["bs"] == 2 and result["steps"] == 40
    for key in ("host_share", "host_share_headless", "host_share_attached"):
        assert 0.0 <= result[key] < 1.0, key  # the emulated replay is part of every step's wall time
    assert result["attached_over_headless"] > 0 and result["gap_p99_ms"] >= result["gap_p50_ms"] > 0
    assert len(result["host_share_by_tenth"]) == 10
    assert "att÷head" in capsys.readouterr().out
