"""``graphtop advise``: the report, the ready config, budgets, measured ratios, and one-line errors."""

from __future__ import annotations

import json
import shlex

import pytest

from graphtop.cli.advise import graph_config_json, parse_size
from graphtop.cli.entry import main
from graphtop.engine.graphs.bucket_demand import DEFAULT_EAGER_RATIO, eager_ratio, phase_demand
from graphtop.engine.telemetry.events import (
    CaptureFinished,
    CaptureProgress,
    CaptureStarted,
    EngineStarted,
    StepEvent,
)
from graphtop.engine.telemetry.trace_writer import write_trace

MiB = 1024**2


def _capture(phase: str, buckets: list[int], per_bucket: int) -> list:
    out = [CaptureStarted(phase=phase, buckets=tuple(buckets), backend="full", ts=1.0)]
    out += [
        CaptureProgress(
            phase=phase, bucket=b, index=i, total=len(buckets), seconds=0.1, memory_bytes=per_bucket * b, ts=1.0
        )
        for i, b in enumerate(buckets, 1)
    ]
    out.append(CaptureFinished(phase=phase, captured=tuple(buckets), seconds=0.5, ts=1.0))
    return out


def _step(phase: str, size: int, path: str, bucket=None, reason=None, host=1.0, replay=None) -> StepEvent:
    return StepEvent(
        step=0,
        phase=phase,
        batch_size=size if phase == "decode" else 1,
        num_tokens=size,
        bucket=bucket,
        padded=(bucket - size) if bucket else 0,
        padding_waste=(bucket - size) / bucket if bucket else 0.0,
        path=path,
        fallback_reason=reason,
        host_ms=host,
        replay_ms=replay,
        ts=2.0,
    )


def _trace(tmp_path, steps, *, capture=True, name="t.jsonl"):
    events = [EngineStarted(graph_config={"prefill": {"max_padding_waste": 0.25}}, ts=1.0)]
    if capture:
        events += _capture("decode", [1, 2, 4, 8], MiB) + _capture("prefill", [64, 256], 4 * 1024)
    path = tmp_path / name
    write_trace(str(path), events + list(steps))
    return path


def _decode_mix():
    # bs 3 and 5-7 pad badly under 1,2,4,8; bs 12 runs eagerly (over the largest bucket)
    steps = [_step("decode", 3, "graph", 4, host=1.0, replay=0.9) for _ in range(20)]
    steps += [_step("decode", n, "graph", 8, host=1.0, replay=0.9) for n in (5, 6, 7) for _ in range(10)]
    steps += [_step("decode", 12, "eager", reason="exceeds_max_bucket", host=5.0) for _ in range(10)]
    steps += [_step("prefill", 100, "graph", 256, host=3.0, replay=2.0), _step("prefill", 60, "graph", 64, host=3.0)]
    return steps


def test_report_and_ready_config(tmp_path, capsys) -> None:
    path = _trace(tmp_path, _decode_mix())
    assert main(["advise", str(path)]) == 0
    out = capsys.readouterr().out
    assert "decode" in out and "advice (at most 4 graphs)" in out
    config = json.loads(shlex.split(out.strip().splitlines()[-1])[1])
    assert config["decode"]["bs"] == [3, 5, 7, 12]  # the observed sizes that matter most, 4 graphs
    assert config["prefill"] == {"num_tokens": [60, 100], "max_padding_waste": 0.25}
    # the decode ratio was measured per row over the phase (no size ran both ways)
    assert "measured per row" in out
    # graph memory from the ledger (1 MiB per decode row): now 1+2+4+8, advice 3+5+7+12
    line = next(ln for ln in out.splitlines() if "graph memory (est.)" in ln)
    assert line.split()[3:] == ["15.0", "MiB", "27.0", "MiB"]


def test_budgets_and_phase(tmp_path, capsys) -> None:
    path = _trace(tmp_path, _decode_mix())
    assert main(["advise", str(path), "--phase", "decode", "--max-graphs", "2"]) == 0
    out = capsys.readouterr().out
    config = json.loads(shlex.split(out.strip().splitlines()[-1])[1])
    assert list(config) == ["decode"] and len(config["decode"]["bs"]) == 2
    assert "\nprefill " not in out
    # memory: 1 MiB per decode row in the ledger; 10 MiB allows buckets summing to 10 rows at most
    assert main(["advise", str(path), "--phase", "decode", "--max-graph-memory", "10MiB"]) == 0
    config = json.loads(shlex.split(capsys.readouterr().out.strip().splitlines()[-1])[1])
    assert sum(config["decode"]["bs"]) <= 10
    assert main(["advise", str(path), "--phase", "decode", "--max-graphs", "0"]) == 0
    config = json.loads(shlex.split(capsys.readouterr().out.strip().splitlines()[-1])[1])
    assert config == {"decode": {"backend": "disabled"}}


def test_eager_ratio_sources() -> None:
    both = [_step("decode", 4, "graph", 4, host=1.0), _step("decode", 4, "eager", reason="capture_failed", host=6.0)]
    assert eager_ratio(both, "decode").value == pytest.approx(6.0)
    assert "both ways" in eager_ratio(both, "decode").source
    emulated = [
        StepEvent(
            step=0,
            phase="decode",
            batch_size=4,
            num_tokens=4,
            bucket=4,
            path="graph",
            host_ms=1.0,
            emulated=True,
            ts=0.0,
        ),
        _step("decode", 4, "eager", reason="x", host=6.0),
    ]
    assert eager_ratio(emulated, "decode").value == DEFAULT_EAGER_RATIO["decode"]
    assert eager_ratio([], "prefill").source == "default"
    d = phase_demand(both + [_step("decode", 9, "eager", reason="context_exceeds_graph")], "decode")
    # the graph step and the failed capture's step asked for a bucket; a context wider than the
    # graph is beyond any list
    assert d.sizes == {4: 2} and d.fixed_eager == 1


def test_sizes_and_config_json() -> None:
    assert parse_size("512MiB") == 512 * MiB and parse_size("1.5G") == 1.5 * 1024**3
    assert parse_size("300MB") == 300e6 and parse_size("1000") == 1000
    assert (
        graph_config_json({"decode": [], "prefill": [8]}, None)
        == '{"decode":{"backend":"disabled"},"prefill":{"num_tokens":[8]}}'
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["advise"], "the following arguments are required: TRACE.jsonl"),
        (["advise", "{missing}"], "cannot read trace"),
        (["advise", "{trace}", "--max-graph-memory", "lots"], "is not a size"),
        (["advise", "{trace}", "--max-graph-memory", "1" + "0" * 400], "is past the largest size, 8 EiB"),
        (["advise", "{trace}", "--max-graph-memory", "9EiB"], "is not a size"),
        (["advise", "{trace}", "--max-graph-memory", "9000000TiB"], "is past the largest size, 8 EiB"),
        (["advise", "{trace}", "--max-graphs", "-1"], "must be >= 0"),
        (["advise", "{trace}", "--phase", "mixed"], "invalid choice"),
        (["advise", "{trace}", "--eager-ratio", "0"], "must be positive"),
        (["advise", "{trace}", "--eager-ratio", "1e308"], "must be <= 1000"),
        (["advise", "{empty}"], "no steps recorded"),
        (["advise", "{nocost}", "--max-graph-memory", "1GiB"], "graph memory cannot be estimated"),
        (["advise", "{trace}", "--phase", "prefill", "--unknown"], "unrecognized arguments"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, argv, message) -> None:
    paths = {
        "trace": _trace(tmp_path, _decode_mix()),
        "empty": _trace(tmp_path, [], name="e.jsonl"),
        "nocost": _trace(tmp_path, _decode_mix(), capture=False, name="n.jsonl"),
        "missing": tmp_path / "nope.jsonl",
    }
    argv = [a.format(**paths) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("graphtop: error: ") and message in err and err.count("\n") == 1


def test_a_measured_ratio_out_of_range_falls_back_to_the_default() -> None:
    """A trace whose graph step took 5e-324 ms would give an infinite ratio and nonsense advice."""
    broken = [
        _step("decode", 4, "graph", 4, host=5e-324),
        _step("decode", 4, "eager", reason="capture_failed", host=6.0),
    ]
    ratio = eager_ratio(broken, "decode")
    assert ratio.value == DEFAULT_EAGER_RATIO["decode"] and not ratio.measured
    assert ratio.source.startswith("default: the measured inf is outside (0, 1000]")


def test_a_chunk_that_ran_eagerly_while_capturing_keeps_its_bucket(tmp_path, capsys) -> None:
    """The SmolLM2 trace's case: one 2,048-token prefill chunk ran eagerly as ``not_yet_captured``
    (the engine serves while its first capture runs) and the 673-token tail replayed a graph. The
    advice once dropped the chunk (``[673]``) and would have sent every later chunk down the eager
    path; a bucket must serve it, and the what-if must show it served."""
    steps = [_step("prefill", 2048, "eager", reason="not_yet_captured", host=40.0)]
    steps += [_step("prefill", 673, "graph", 1024, host=3.0, replay=9.0)]
    steps += [_step("prefill", 40, "eager", reason="kernels_compiling", host=2.0)]
    steps += [_step("decode", 1, "graph", 1, host=1.0, replay=0.5) for _ in range(30)]
    events = [EngineStarted(graph_config={"prefill": {"max_padding_waste": 0.5}}, ts=1.0)]
    events += _capture("decode", [1, 2, 4, 8], MiB) + _capture("prefill", [64, 256, 1024, 2048], 4 * 1024)
    path = tmp_path / "smollm2.jsonl"
    write_trace(str(path), events + steps)
    assert main(["advise", str(path), "--phase", "prefill", "--max-graphs", "2"]) == 0
    out = capsys.readouterr().out
    config = json.loads(shlex.split(out.strip().splitlines()[-1])[1])
    assert max(config["prefill"]["num_tokens"]) >= 2048, out
    assert "left without a bucket" not in out
    hit_rate = next(ln for ln in out.splitlines() if "hit rate" in ln).split()
    assert hit_rate[-1] != "0.0%"
    demand = phase_demand(steps, "prefill")
    assert demand.sizes == {2048: 1, 673: 1, 40: 1} and demand.fixed_eager == 0


def test_a_memory_budget_that_drops_a_needed_size_says_so(tmp_path, capsys) -> None:
    steps = [_step("decode", 2, "graph", 2, host=1.0, replay=0.5) for _ in range(30)]
    steps += [_step("decode", 30, "eager", reason="exceeds_max_bucket", host=60.0)]
    path = _trace(tmp_path, steps)
    # the ledger's 1 MiB per decode row: 30 rows do not fit in 8 MiB
    assert main(["advise", str(path), "--phase", "decode", "--max-graph-memory", "8MiB"]) == 0
    out = capsys.readouterr().out
    assert "1 step(s) of 1 size(s) up to 30 left without a bucket: the graph memory budget" in out, out
    assert "memory per bucket" in out


def test_held_out_costs_beside_training_costs(tmp_path, capsys) -> None:
    path = _trace(tmp_path, _decode_mix())
    assert main(["advise", str(path), "--phase", "decode"]) == 0
    out = capsys.readouterr().out
    train = next(ln for ln in out.splitlines() if "train cost ÷ ideal" in ln).split()
    held = next(ln for ln in out.splitlines() if "held-out cost ÷ ideal" in ln).split()
    assert len(train) == 6 and len(held) == 6  # a number for the lists in use and for the advice
    assert "the last 15 of 60 steps; buckets in multiples of" in out
    assert main(["advise", str(path), "--phase", "decode", "--holdout", "0"]) == 0
    assert "held out              nothing" in capsys.readouterr().out
    assert main(["advise", str(path), "--holdout", "2"]) == 2
    assert "--holdout" in capsys.readouterr().err
