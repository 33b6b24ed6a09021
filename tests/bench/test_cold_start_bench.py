"""bench/cold_start_bench.py runs end to end on CPU: a cold and a warm start, each in a process of its own, serve
the whole synthetic burst, and the JSON and the table say what each cost; the targets apply to the rows they
name."""

from __future__ import annotations

import json

import cold_start_bench  # noqa: E402  (bench/ is on pytest's pythonpath)


def test_a_cold_and_a_warm_start_serve_the_burst_on_cpu(tmp_path, capsys) -> None:
    argv = ["--device", "cpu", "--shape", "tiny", "--requests", "4", "--prompt-len", "uniform:4:24"]
    argv += ["--output-len", "fixed:4", "--modes", "cold,warm", "--out", str(tmp_path)]
    assert cold_start_bench.main(argv) == 0
    data = json.loads((tmp_path / "cold_start.json").read_text())
    assert [s["mode"] for s in data["starts"]] == ["cold", "warm"]
    assert data["note"].startswith("cpu: no Triton") and data["targets"] == []
    for start in data["starts"]:
        assert start["output_tokens"] == 16 and start["dropped_events"] == 0
        assert sum(start["paths"].values()) == start["steps"] > 0
        assert start["load_s"] > 0 and start["live_s"] >= 0 and start["output_tok_s"] > 0
        assert start["ttft_p50_ms"] is not None and start["kernels"] is None  # no compiler without CUDA
    printed = capsys.readouterr().out
    assert "| tiny | cold |" in printed and "| tiny | warm |" in printed


def test_a_warm_start_runs_after_a_cold_one_and_off_last():
    assert cold_start_bench.modes_in_order(["warm"]) == ["cold", "warm"]
    assert cold_start_bench.modes_in_order(["off", "cold"]) == ["cold", "off"]


def test_the_targets_apply_to_the_rows_they_name():
    row = dict(shape="llama-3.1-8b", mode="cold", host_max_ms=12.0, live_s=11.0, gpu_ratio=0.85)
    checks = {c["what"]: c["met"] for c in cold_start_bench.target_checks([row])}
    assert checks == {
        "worst step launch ms while capturing": True,
        "s from load to all graphs live": False,
        "output tok/s ÷ (tokens ÷ Σ GPU step time)": True,
    }
    assert cold_start_bench.target_checks([dict(row, shape="tiny")]) == []
