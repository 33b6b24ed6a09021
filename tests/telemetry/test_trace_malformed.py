"""Malformed trace lines: every reader (summary, Perfetto export, the dashboard's replay) reports
``path:LINE: message`` (exit 2 on the command line) and never crashes, whatever the line holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphtop.cli.entry import main
from graphtop.engine.telemetry.events import ErrorEvent, MemoryLedger, ParityCheck, StepEvent, TraceHeader
from graphtop.engine.trace_tools.trace import TraceError, read_trace


def _json(obj) -> str:
    return json.dumps(obj, separators=(",", ":"))


HEADER = _json(TraceHeader(ts=1000.0, meta={"run": "t"}).to_dict()) + "\n"


def _dict_line(event, **changes) -> dict:
    d = event.to_dict()
    d.update(changes)
    return d


LEDGER = MemoryLedger(ts=1001.0, device="cpu", total=10, weights=4, kv_pool=3)
STEP = StepEvent(ts=1001.0, step=1, phase="decode", batch_size=1, num_tokens=1, host_ms=1.0)
GRAPH_STEP = StepEvent(
    ts=1001.0,
    step=1,
    phase="decode",
    batch_size=16,
    num_tokens=16,
    bucket=64,
    padded=48,
    padding_waste=0.75,
    path="graph",
    host_ms=1.0,
    replay_ms=0.5,
)
PREFILL_STEP = StepEvent(
    ts=1001.0,
    step=1,
    phase="prefill",
    batch_size=2,
    num_tokens=100,
    bucket=128,
    padded=28,
    padding_waste=28 / 128,
    path="graph",
    host_ms=1.0,
)
PARITY = ParityCheck(ts=1001.0, step=1, phase="decode", batch_size=4, num_tokens=4, bucket=8, rows=4)

# values each valid alone that no engine writes together (engine/telemetry/consistency.py)
IMPOSSIBLE_LINES = {
    "bucket-0": (_json(_dict_line(GRAPH_STEP, bucket=0)), "bucket 0"),
    "bucket-under-batch": (
        _json(_dict_line(GRAPH_STEP, bucket=8, padded=0, padding_waste=0.0)),
        "bucket 8 is smaller than the step's 16 rows",
    ),
    "prefill-bucket-under-tokens": (
        _json(_dict_line(PREFILL_STEP, bucket=64, padded=0, padding_waste=0.0)),
        "bucket 64 is smaller than the step's 100 tokens",
    ),
    "padded-past-bucket": (_json(_dict_line(GRAPH_STEP, padded=60, padding_waste=60 / 64)), "padded 60"),
    "waste-not-padded-over-bucket": (_json(_dict_line(GRAPH_STEP, padding_waste=0.0)), "padding_waste 0.0"),
    "waste-over-one": (_json(_dict_line(GRAPH_STEP, padding_waste=7.5)), "padding_waste 7.5"),
    "eager-with-padding": (_json(_dict_line(GRAPH_STEP, path="eager", bucket=None)), "eager step"),
    "graph-without-bucket": (
        _json(_dict_line(GRAPH_STEP, bucket=None, padded=0, padding_waste=0.0)),
        "without a bucket",
    ),
    "tokens-under-requests": (_json(_dict_line(STEP, batch_size=16, num_tokens=4)), "16 requests in 4 tokens"),
    "unknown-path": (_json(_dict_line(STEP, path="warp")), "neither graph nor eager"),
    "parity-bucket-0": (_json(_dict_line(PARITY, bucket=0)), "bucket 0"),
    "parity-fraction-over-one": (_json(_dict_line(PARITY, argmax_agree=2.0)), "argmax_agree 2.0"),
}

# (bad line 2, what the message must say)
BAD_LINES = {
    "array": ("[1, 2, 3]", "not a JSON object"),
    "string": ('"hello"', "not a JSON object"),
    "number": ("42", "not a JSON object"),
    "null": ("null", "not a JSON object"),
    "nan-ts": (_json(_dict_line(STEP)).replace('"ts":1001.0', '"ts":NaN'), "NaN"),
    "inf-ts": (_json(_dict_line(STEP)).replace('"ts":1001.0', '"ts":Infinity'), "Infinity"),
    "minus-inf": (_json(_dict_line(STEP)).replace('"host_ms":1.0', '"host_ms":-Infinity'), "-Infinity"),
    "1e400-float": (_json(_dict_line(STEP)).replace('"host_ms":1.0', '"host_ms":1e400'), "not finite"),
    "10^400-int": (_json(_dict_line(LEDGER)).replace('"total":10', '"total":1' + "0" * 400), "out of range"),
    "10^5000-int": (_json(_dict_line(LEDGER)).replace('"total":10', '"total":1' + "0" * 5000), "out of range"),
    "negative-size": (_json(_dict_line(STEP, batch_size=-3)), "batch_size"),
    "negative-ts": (_json(_dict_line(STEP, ts=-5.0)), "ts"),
    "huge-duration": (_json(_dict_line(STEP, host_ms=1e300)), "host_ms"),
    "deep-nesting": ("[" * 100_000 + "]" * 100_000, "nested"),
    "deep-object-in-any": (
        _json({"type": "config_downgrade", "ts": 1001.0, "key": "k", "reason": "r", "new": None})
        .replace('"new":null', '"new":' + "[" * 200 + "]" * 200)
        .replace('{"type"', '{"old":1,"type"'),
        "nested",
    ),
    "lone-surrogate": (_json(_dict_line(ErrorEvent(ts=1001.0, message="x"))).replace('"x"', '"\\ud800"'), "Unicode"),
    "nan-inside-any": (
        _json({"type": "config_downgrade", "ts": 1001.0, "key": "k", "old": [1.0], "new": 2, "reason": "r"}).replace(
            "[1.0]", "[1e999]"
        ),
        "finite",
    ),
    **IMPOSSIBLE_LINES,
}


def _trace(tmp_path: Path, bad: str) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text(HEADER + bad + "\n" + json.dumps(STEP.to_dict()) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("case", BAD_LINES)
def test_reader_reports_path_line_and_reason(tmp_path, case):
    bad, needle = BAD_LINES[case]
    path = _trace(tmp_path, bad)
    with pytest.raises(TraceError) as info:
        read_trace(path)
    message = str(info.value)
    assert message.startswith(f"{path}:2: ") and "\n" not in message and len(message) < 400, message
    assert needle in message, message


@pytest.mark.parametrize("case", BAD_LINES)
@pytest.mark.parametrize("command", ["summary", "export"])
def test_trace_commands_exit_2_with_one_line(tmp_path, capsys, case, command):
    path = _trace(tmp_path, BAD_LINES[case][0])
    out = tmp_path / "out.json"
    argv = (
        ["trace", "summary", str(path)]
        if command == "summary"
        else ["trace", "export", "--perfetto", str(path), str(out)]
    )
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"graphtop: error: {path}:2: ")
    assert not out.exists()


def test_possible_steps_read_and_summarise(tmp_path):
    """The impossible lines above are these ones changed: as written, they are read and reported."""
    from graphtop.engine.trace_tools.report import format_summary
    from graphtop.engine.trace_tools.summary import summarize

    path = tmp_path / "t.jsonl"
    path.write_text(HEADER + "".join(_json(e.to_dict()) + "\n" for e in (GRAPH_STEP, PREFILL_STEP, PARITY, STEP)))
    trace = read_trace(path)
    assert trace.events == [GRAPH_STEP, PREFILL_STEP, PARITY, STEP]
    assert "76 padded of 192 bucket tokens" in format_summary(summarize(trace))  # 48 of 64, 28 of 128


@pytest.mark.parametrize("case", ["bucket-0", "padded-past-bucket"])
def test_advise_and_replay_refuse_impossible_values_with_the_line(tmp_path, capsys, monkeypatch, case):
    import graphtop.tui.app
    from graphtop.cli.launch import run_replay

    monkeypatch.setattr(graphtop.tui.app, "GraphtopApp", None)  # never opens a terminal UI here
    path = _trace(tmp_path, IMPOSSIBLE_LINES[case][0])
    assert main(["advise", str(path)]) == 2
    assert run_replay(str(path)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith(f"graphtop: error: {path}:2: ") for line in err), err
    assert all(IMPOSSIBLE_LINES[case][1] in line for line in err)


def test_bad_header_line_is_reported_too(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(HEADER.replace('"ts":1000.0', '"ts":NaN'))
    with pytest.raises(TraceError, match=r":1: .*NaN"):
        read_trace(path)


def test_numbers_at_the_limits_are_accepted(tmp_path):
    big = _dict_line(LEDGER, total=2**63 - 1, weights=0)
    path = tmp_path / "t.jsonl"
    path.write_text(HEADER + json.dumps(big) + "\n")
    assert read_trace(path).events[0].total == 2**63 - 1
    assert main(["trace", "summary", str(path)]) == 0


def test_launch_replay_shows_the_error(tmp_path, capsys, monkeypatch):
    import graphtop.tui.app
    from graphtop.cli.launch import run_replay

    monkeypatch.setattr(graphtop.tui.app, "GraphtopApp", None)  # never opens a terminal UI here

    path = _trace(tmp_path, BAD_LINES["1e400-float"][0])
    assert run_replay(str(path)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"graphtop: error: {path}:2: ")


async def test_dashboard_open_trace_shows_the_error(tmp_path):
    from graphtop.tui.app import GraphtopApp
    from graphtop.tui.sessions.fake import FakeSession

    path = _trace(tmp_path, BAD_LINES["10^400-int"][0])
    app = GraphtopApp(FakeSession(), poll_device=False)
    shown: list[str] = []
    async with app.run_test() as pilot:
        app.notify = lambda message, **kw: shown.append(message)  # type: ignore[method-assign]
        await app.open_trace(str(path)).wait()  # read by a worker
        await pilot.pause()
        assert app.session.kind != "replay"
    assert len(shown) == 1 and shown[0].startswith(f"{path}:2: ") and "out of range" in shown[0]


def _events_at(int_value: int, float_value: float) -> list:
    """One event of every type, every numeric field (but ts) at the given value."""
    import dataclasses
    import typing

    from graphtop.engine.telemetry import events as ev

    out = []
    for n, cls in enumerate(t for t in ev.EVENT_TYPES.values() if t is not ev.TraceHeader):
        hints = typing.get_type_hints(cls)
        values = {}
        for f in dataclasses.fields(cls):
            hint = hints[f.name]
            if typing.get_origin(hint) is typing.Union:  # Optional[X] -> X
                hint = next(a for a in typing.get_args(hint) if a is not type(None))
            if f.name == "ts":
                continue
            if typing.get_origin(hint) is tuple and typing.get_args(hint)[0] is int:
                values[f.name] = (int_value, 1)
            elif hint is int:
                values[f.name] = int_value
            elif hint is float:
                values[f.name] = float_value
        if cls in (ev.StepEvent, ev.ParityCheck):  # at the limits, yet possible: a full bucket (none at 0)
            values.update(bucket=int_value or None)
        if cls is ev.StepEvent:
            values.update(path="graph" if int_value else "eager", padded=0, padding_waste=0.0)
        if cls is ev.ParityCheck:  # fractions of the rows
            values.update(argmax_agree=min(float_value, 1.0), top5_overlap=min(float_value, 1.0))
        out.append(cls(ts=1000.0 + n, **values))
    return out


@pytest.mark.parametrize("int_value,float_value", [(2**63 - 1, 2.0**53), (0, 0.0)])
async def test_values_at_the_limits_replay_in_the_dashboard(tmp_path, int_value, float_value):
    """What the reader accepts, every reader shows: the summary, Perfetto and the dashboard's panels."""
    from graphtop.engine.trace_tools.perfetto import write_perfetto
    from graphtop.engine.trace_tools.report import format_summary
    from graphtop.engine.trace_tools.summary import summarize
    from graphtop.tui.app import GraphtopApp
    from graphtop.tui.sessions.replay import ReplaySession
    from graphtop.tui.testing import FIXED_DEVICE, screen_text, settle

    path = tmp_path / "t.jsonl"
    path.write_text(HEADER + "".join(_json(e.to_dict()) + "\n" for e in _events_at(int_value, float_value)))
    trace = read_trace(path)
    assert format_summary(summarize(trace))
    write_perfetto(trace, tmp_path / "p.json")
    json.loads((tmp_path / "p.json").read_text())
    replay = ReplaySession.from_path(str(path), paused=True)
    app = GraphtopApp(replay, poll_device=False, device_sample=FIXED_DEVICE, animate=False, tick_hz=None)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot)
        replay.seek_to(replay.duration)
        app.pump()
        await settle(pilot)
        assert app.state.events_seen == len(trace.events) and "REPLAY" in screen_text(app)


def test_a_line_past_the_limit_is_an_error_not_an_endless_read(tmp_path, monkeypatch, capsys):
    """/dev/zero has no newline: reading it line by line would never end; a long line is refused."""
    import graphtop.engine.trace_tools.trace as trace_mod

    monkeypatch.setattr(trace_mod, "MAX_LINE_BYTES", 1 << 10)
    long_line = tmp_path / "long.jsonl"
    long_line.write_bytes(b"x" * 5000)
    for path in [long_line] + ([Path("/dev/zero")] if Path("/dev/zero").exists() else []):
        with pytest.raises(TraceError, match="line longer than"):
            read_trace(path)
        assert main(["trace", "summary", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "line longer than" in err


def test_an_export_named_like_a_folder_keeps_the_trace(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text(HEADER + json.dumps(STEP.to_dict()) + "\n")
    before = path.read_bytes()
    for out in (f"{path}/", f"{path}/.", f"{tmp_path / 'new'}/"):
        assert main(["trace", "export", str(path), out]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "names a folder" in err[0], err
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl"]
