"""bench/eager_launch_bench.py's stub mode runs on the CPU where Triton is installed (skipped without it): the
decode forward of a 2-layer Qwen3-0.6B-shaped model launches every kernel through both paths."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

import eager_launch_bench  # noqa: E402  (bench/ is on pytest's pythonpath)


def test_the_stub_mode_times_both_launch_paths(capsys):
    argv = ["--device", "stub", "--layers", "2", "--rounds", "1", "--steps", "2"]
    assert eager_launch_bench.main(argv) == 0
    out = capsys.readouterr().out
    # a layer: the q|k|v GEMV, the decode attention, the o GEMV, gate|up and down GEMVs; then the lm_head GEMV
    assert "11 launches a forward" in out
    assert "| FastKernel | Triton's launch | FastKernel ÷ Triton |" in out


def test_a_batch_past_the_fused_gemv_rows_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        eager_launch_bench.main(["--bs", "5"])
    assert exit_.value.code == 2
    assert "the fused-GEMV layers take 1-4 rows" in capsys.readouterr().err
