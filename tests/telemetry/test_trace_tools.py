"""Trace reader errors, summary numbers, Perfetto export structure, and the schema doc."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import REPO

from graphtop.engine.telemetry.events import (
    EVENT_TYPES,
    CaptureFinished,
    CaptureProgress,
    CaptureStarted,
    ConfigDowngrade,
    EngineStarted,
    ErrorEvent,
    Event,
    KVPoolState,
    MemoryLedger,
    RequestFinished,
    RequestFirstToken,
    RequestQueued,
    StepEvent,
    TraceHeader,
    validate_event_dict,
)
from graphtop.engine.trace_tools.perfetto import PID, TID_EAGER, TID_GRAPH, export_perfetto, write_perfetto
from graphtop.engine.trace_tools.report import format_summary
from graphtop.engine.trace_tools.stats import percentile
from graphtop.engine.trace_tools.summary import summarize
from graphtop.engine.trace_tools.trace import Trace, TraceError, iter_trace_dicts, read_trace

T0 = 1000.0


def line(event: Event) -> str:
    return json.dumps(event.to_dict(), separators=(",", ":")) + "\n"


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(lines), encoding="utf-8")
    return path


def header_line() -> str:
    return line(TraceHeader(ts=T0, meta={"run": "test"}))


def gstep(n: int, ts: float, bucket: int, batch: int, replay: float, host: float = 1.0) -> StepEvent:
    padded = bucket - batch
    return StepEvent(
        ts=ts,
        step=n,
        phase="decode",
        batch_size=batch,
        num_tokens=batch,
        bucket=bucket,
        padded=padded,
        padding_waste=padded / bucket,
        path="graph",
        host_ms=host,
        replay_ms=replay,
    )


def estep(n: int, ts: float, phase: str, reason: str | None, host: float) -> StepEvent:
    return StepEvent(
        ts=ts,
        step=n,
        phase=phase,
        batch_size=1,
        num_tokens=16 if phase == "prefill" else 1,
        path="eager",
        fallback_reason=reason,
        host_ms=host,
    )


def sample_events() -> list[Event]:
    """A small run: one decode capture pass, 2 requests, 10 steps (step number 5 missing)."""
    return [
        EngineStarted(ts=T0, model="tiny", device="cpu", dtype="float32", emulated=False),
        CaptureStarted(ts=T0 + 0.1, phase="decode", buckets=(1, 2, 4), backend="cuda_graph"),
        CaptureProgress(ts=T0 + 0.2, phase="decode", bucket=1, index=1, total=3, seconds=0.1, memory_bytes=1000),
        CaptureProgress(ts=T0 + 0.4, phase="decode", bucket=2, index=2, total=3, seconds=0.2, memory_bytes=2000),
        CaptureProgress(
            ts=T0 + 0.45,
            phase="decode",
            bucket=4,
            index=3,
            total=3,
            seconds=0.05,
            ok=False,
            failure_reason="oom",
        ),
        CaptureFinished(
            ts=T0 + 0.5,
            phase="decode",
            captured=(1, 2),
            failed=(4,),
            seconds=0.4,
            memory_bytes=3000,
        ),
        MemoryLedger(ts=T0 + 0.6, device="cpu", total=10_000, weights=4000, kv_pool=3000, decode_graphs=3000),
        RequestQueued(ts=T0 + 1.0, request_id="r1", prompt_tokens=16, max_new_tokens=10),
        RequestQueued(ts=T0 + 1.0, request_id="r2", prompt_tokens=16, max_new_tokens=30),
        estep(0, T0 + 1.01, "prefill", "prefill_eager", host=5.0),
        estep(1, T0 + 1.02, "prefill", "prefill_eager", host=7.0),
        RequestFirstToken(ts=T0 + 1.05, request_id="r1", ttft_ms=50.0),
        RequestFirstToken(ts=T0 + 1.07, request_id="r2", ttft_ms=70.0),
        KVPoolState(ts=T0 + 1.1, capacity_tokens=100, used_tokens=34),
        gstep(2, T0 + 1.2, bucket=2, batch=2, replay=1.0),
        gstep(3, T0 + 1.3, bucket=2, batch=2, replay=2.0),
        gstep(4, T0 + 1.4, bucket=2, batch=2, replay=3.0),
        gstep(6, T0 + 1.5, bucket=4, batch=3, replay=4.0),
        gstep(7, T0 + 1.6, bucket=4, batch=3, replay=5.0),
        gstep(8, T0 + 1.7, bucket=4, batch=3, replay=6.0),
        estep(9, T0 + 1.8, "decode", "batch_too_large", host=2.0),
        estep(10, T0 + 1.9, "decode", None, host=3.0),
        KVPoolState(ts=T0 + 2.0, capacity_tokens=100, used_tokens=60),
        ConfigDowngrade(ts=T0 + 2.5, key="decode_bs", old=[1, 2, 4], new=[1, 2], reason="capture failed"),
        RequestFinished(ts=T0 + 3.0, request_id="r1", output_tokens=10, finish_reason="stop", latency_ms=2000.0),
        ErrorEvent(ts=T0 + 4.0, message="hiccup", where="sched"),
        RequestFinished(ts=T0 + 5.0, request_id="r2", output_tokens=30, finish_reason="length", latency_ms=4000.0),
    ]


def sample_trace() -> Trace:
    return Trace(path="mem.jsonl", header=TraceHeader(ts=T0, meta={"run": "test"}), events=sample_events())


# -- reader ---------------------------------------------------------------------------------------


def test_roundtrip_through_file(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "t.jsonl", [header_line()] + [line(e) for e in sample_events()])
    trace = read_trace(path)
    assert trace.header.meta == {"run": "test"} and trace.schema_version == 1
    assert trace.events == sample_events()
    assert not trace.truncated_tail
    dicts = list(iter_trace_dicts(path))
    assert dicts[0]["type"] == "header" and len(dicts) == len(sample_events()) + 1


def test_bad_json_reports_line_number(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "t.jsonl", [header_line(), line(sample_events()[0]), "{not json\n", line(sample_events()[1])]
    )
    with pytest.raises(TraceError, match=r"t\.jsonl:3: bad JSON"):
        read_trace(path)


def test_schema_violation_reports_line_number(tmp_path: Path) -> None:
    bad = sample_events()[9].to_dict()
    bad["batch_size"] = "two"
    path = write_lines(tmp_path / "t.jsonl", [header_line(), json.dumps(bad) + "\n"])
    with pytest.raises(TraceError, match=r"t\.jsonl:2: schema violation: .*batch_size"):
        read_trace(path)


def test_unknown_type_and_extra_field(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "a.jsonl", [header_line(), '{"type":"bogus","ts":1}\n'])
    with pytest.raises(TraceError, match=r"a\.jsonl:2: .*unknown event type 'bogus'"):
        read_trace(path)
    extra = sample_events()[0].to_dict() | {"surprise": 1}
    path = write_lines(tmp_path / "b.jsonl", [header_line(), json.dumps(extra) + "\n"])
    with pytest.raises(TraceError, match=r"b\.jsonl:2: .*unexpected field 'surprise'"):
        read_trace(path)


def test_missing_header(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "t.jsonl", [line(sample_events()[0])])
    with pytest.raises(TraceError, match=r"t\.jsonl:1: first line is not a trace header \(got type 'engine_started'\)"):
        read_trace(path)


def test_bad_header_fields(tmp_path: Path) -> None:
    h = TraceHeader(ts=T0).to_dict()
    h["schema_version"] = "1"
    with pytest.raises(TraceError, match=r":1: bad header: schema_version"):
        read_trace(write_lines(tmp_path / "a.jsonl", [json.dumps(h) + "\n"]))
    h = TraceHeader(ts=T0).to_dict()
    del h["meta"]
    with pytest.raises(TraceError, match=r":1: bad header: .*missing field 'meta'"):
        read_trace(write_lines(tmp_path / "b.jsonl", [json.dumps(h) + "\n"]))
    h = TraceHeader(ts=T0, schema_version=99).to_dict()
    with pytest.raises(TraceError, match=r":1: trace schema_version 99 is newer"):
        read_trace(write_lines(tmp_path / "c.jsonl", [json.dumps(h) + "\n"]))
    for version in (0, -1):  # no graphtop wrote one: versions start at 1
        h = TraceHeader(ts=T0).to_dict()
        h["schema_version"] = version
        with pytest.raises(TraceError, match=rf":1: bad header: schema_version should be 1 or more, got {version}"):
            read_trace(write_lines(tmp_path / "d.jsonl", [json.dumps(h) + "\n"]))


def test_empty_missing_and_concatenated(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"empty\.jsonl:1: empty trace"):
        read_trace(write_lines(tmp_path / "empty.jsonl", []))
    with pytest.raises(TraceError, match=r"nowhere\.jsonl: cannot read trace"):
        read_trace(tmp_path / "nowhere.jsonl")
    with pytest.raises(TraceError, match=r"cat\.jsonl:3: unexpected second trace header"):
        read_trace(write_lines(tmp_path / "cat.jsonl", [header_line(), line(sample_events()[0]), header_line()]))


def test_truncated_tail_only_at_end(tmp_path: Path) -> None:
    full = line(sample_events()[1])
    path = write_lines(tmp_path / "t.jsonl", [header_line(), line(sample_events()[0]), full[: len(full) // 2]])
    trace = read_trace(path)
    assert trace.truncated_tail and len(trace.events) == 1
    # a complete final line merely lacking its newline is kept
    path = write_lines(tmp_path / "u.jsonl", [header_line(), full.rstrip("\n")])
    trace = read_trace(path)
    assert not trace.truncated_tail and len(trace.events) == 1
    # a truncated line in the middle is corruption, not a tail
    path = write_lines(tmp_path / "v.jsonl", [header_line(), full[:20] + "\n", full])
    with pytest.raises(TraceError, match=r"v\.jsonl:2: bad JSON"):
        read_trace(path)
    # a trace whose header itself is cut off has nothing usable
    with pytest.raises(TraceError, match=r"w\.jsonl:1: header line is truncated"):
        read_trace(write_lines(tmp_path / "w.jsonl", [header_line()[:30]]))


def test_blank_lines_are_ignored(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "t.jsonl", [header_line(), "\n", line(sample_events()[0]), "\n"])
    assert len(read_trace(path).events) == 1


# -- summary --------------------------------------------------------------------------------------


def test_percentile_linear_interpolation() -> None:
    vals = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert percentile(vals, 50) == pytest.approx(3.5)
    assert percentile(vals, 90) == pytest.approx(5.5)
    assert percentile(vals, 99) == pytest.approx(5.95)
    assert percentile([7.0], 99) == 7.0


def test_summary_numbers() -> None:
    s = summarize(sample_trace())
    assert s.meta == {"run": "test"} and s.engine is not None and s.engine.model == "tiny"
    assert not s.emulated and not s.truncated_tail
    # requests and throughput
    assert (s.requests_queued, s.requests_finished) == (2, 2)
    assert s.finish_reasons == {"stop": 1, "length": 1}
    assert s.output_tokens == 40 and s.prompt_tokens == 32
    assert s.wall_s == pytest.approx(5.0)
    assert s.serving_s == pytest.approx(4.0)
    assert s.tokens_per_s == pytest.approx(10.0)
    assert s.ttft_ms.p50 == pytest.approx(60.0)
    # steps and graph hit rate
    assert s.steps == 10 and s.graph_steps == 6
    assert s.hit_rate == pytest.approx(0.6)
    assert s.phases["decode"].hit_rate == pytest.approx(0.75)
    assert s.phases["prefill"].hit_rate == 0.0
    assert {p: ph.steps for p, ph in s.phases.items()} == {"prefill": 2, "decode": 8}
    # buckets and padding
    buckets = s.phases["decode"].buckets
    assert list(buckets) == [2, 4]
    assert (buckets[2].count, buckets[2].padded_tokens, buckets[2].mean_waste) == (3, 0, 0.0)
    assert (buckets[4].count, buckets[4].padded_tokens) == (3, 3)
    assert buckets[4].mean_waste == pytest.approx(0.25)
    assert (s.padded_tokens, s.bucket_tokens) == (3, 18)
    assert s.padding_waste == pytest.approx(1 / 6)
    # fallbacks ranked by count, ties by name
    assert s.fallbacks == [("prefill_eager", 2), ("(unspecified)", 1), ("batch_too_large", 1)]
    # timings
    assert (s.replay_ms.count, s.replay_ms.p50, s.replay_ms.p90) == (6, 3.5, 5.5)
    assert s.replay_ms.p99 == pytest.approx(5.95)
    assert s.host_ms.count == 10
    assert s.host_ms.p50 == pytest.approx(1.0) and s.host_ms.max == 7.0
    assert s.phases["prefill"].host_ms.p50 == pytest.approx(6.0)
    # capture, memory, misc
    assert len(s.captures) == 1
    cap = s.captures[0]
    assert cap.finished and cap.captured == [1, 2] and cap.failed == {4: "oom"}
    assert (cap.seconds, cap.memory_bytes, cap.planned) == (0.4, 3000, (1, 2, 4))
    assert s.memory is not None and s.memory.weights == 4000
    assert (s.kv_peak_used_tokens, s.kv_capacity_tokens) == (60, 100)
    assert s.missing_steps == 1
    assert len(s.downgrades) == 1 and len(s.errors) == 1
    assert s.counts["step"] == 10 and s.events == len(sample_events())


def test_summary_from_plain_event_list_matches_trace() -> None:
    a = summarize(sample_trace())
    b = summarize(sample_events(), header=TraceHeader(ts=T0, meta={"run": "test"}))
    b.path = a.path
    assert a == b


def test_unfinished_capture_and_emulated_flag() -> None:
    events: list[Event] = [
        CaptureStarted(ts=T0, phase="prefill", buckets=(64, 128)),
        CaptureProgress(ts=T0 + 1, phase="prefill", bucket=64, seconds=0.5, memory_bytes=10),
        StepEvent(ts=T0 + 2, step=0, phase="decode", path="graph", bucket=1, replay_ms=0.1, emulated=True),
    ]
    s = summarize(events)
    assert s.emulated
    cap = s.captures[0]
    assert not cap.finished and cap.captured == [64] and cap.seconds == 0.5 and cap.memory_bytes == 10
    text = format_summary(s)
    assert "EMULATED" in text and "(unfinished)" in text


def test_format_summary_text() -> None:
    text = format_summary(summarize(sample_trace()), ascii_only=True)
    assert "hit rate" in text
    assert "60.0%" in text and "75.0%" in text
    assert "prefill_eager" in text and text.index("prefill_eager") < text.index("batch_too_large")
    assert "16.7%" in text  # padding waste overall
    assert "###" in text  # bucket bars
    assert "10.0 output tok/s" in text
    assert "bucket 4: oom" in text
    assert "Memory ledger" in text and "decode_bs" in text
    assert "step numbers missing from the trace: 1" in text
    assert "setup:" not in text  # the sample's engine left no note
    empty = format_summary(summarize([]))
    assert "0 events" in empty


def test_format_summary_shows_how_the_engine_set_itself_up() -> None:
    """The engine-started note (backend choice, model kernels, packed skinny weights) is a summary line."""
    note = (
        "flashinfer selected · model kernels: triton-fused · packed skinny weights for steps of 17-64 tokens (13.0 GiB)"
    )
    events = [
        EngineStarted(
            ts=T0,
            model="tiny",
            device="cuda",
            dtype="bfloat16",
            attention_backend="flashinfer",
            attention_backend_note=note,
        )
    ]
    assert f"  setup: {note}" in format_summary(summarize(events)).splitlines()


# -- perfetto -------------------------------------------------------------------------------------


def test_perfetto_structure(tmp_path: Path) -> None:
    data = export_perfetto(sample_trace())
    assert data["displayTimeUnit"] == "ms"
    evs = data["traceEvents"]
    assert json.loads(json.dumps(data, allow_nan=False)) == data

    meta = [e for e in evs if e["ph"] == "M"]
    names = {(e["name"], e.get("tid")): e["args"].get("name") for e in meta}
    assert names[("process_name", None)] == "graphtop engine"
    assert names[("thread_name", TID_GRAPH)] == "graph steps"
    assert names[("thread_name", TID_EAGER)] == "eager steps"

    slices = [e for e in evs if e["ph"] == "X"]
    steps = [e for e in slices if e["cat"] == "step"]
    assert len([e for e in steps if e["tid"] == TID_GRAPH]) == 6
    assert len([e for e in steps if e["tid"] == TID_EAGER]) == 4
    for e in slices:
        assert e["pid"] == PID and e["dur"] >= 0 and e["ts"] >= 0
    g = next(e for e in steps if e["args"]["step"] == 6)
    assert g["dur"] == pytest.approx(4000.0)  # replay_ms 4.0 -> 4000 µs
    assert g["ts"] + g["dur"] == pytest.approx(1.5e6)  # ends at the event's ts (relative to header)
    assert (g["args"]["bucket"], g["args"]["padded"]) == (4, 1)
    fb = next(e for e in steps if e["args"]["step"] == 9)
    assert fb["args"]["fallback_reason"] == "batch_too_large" and fb["dur"] == pytest.approx(2000.0)
    # slices on one track never overlap
    for tid in {e["tid"] for e in slices}:
        track = sorted((e for e in slices if e["tid"] == tid), key=lambda e: e["ts"])
        for a, b in zip(track, track[1:]):
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-6

    captures = [e for e in slices if e["cat"] == "capture"]
    assert len(captures) == 4  # 3 buckets + 1 pass
    assert any("FAILED" in e["name"] for e in captures)

    counters = [e for e in evs if e["ph"] == "C"]
    kv = [e["args"]["used_tokens"] for e in counters if e["name"] == "kv"]
    assert kv == [34, 60]
    assert [e["args"]["waste"] for e in counters if e["name"] == "padding"] == [0.0] * 3 + [0.25] * 3
    assert any(e["name"] == "memory" for e in counters)

    begins = [e for e in evs if e["ph"] == "b"]
    ends = [e for e in evs if e["ph"] == "e"]
    assert sorted(e["id"] for e in begins) == sorted(e["id"] for e in ends)
    assert {"r1", "r2"} <= {e["id"] for e in begins}
    assert any(e["ph"] == "i" and e["cat"] == "error" for e in evs)

    out = write_perfetto(sample_trace(), tmp_path / "out.json")
    assert json.loads(out.read_text()) == data


def test_perfetto_closes_unfinished_requests_and_handles_nan() -> None:
    trace = Trace(
        path="x",
        header=TraceHeader(ts=T0),
        events=[
            RequestQueued(ts=T0 + 1, request_id="r9"),
            StepEvent(ts=T0 + 2, step=0, phase="decode", path="eager", host_ms=float("nan")),
        ],
    )
    data = export_perfetto(trace)
    json.dumps(data, allow_nan=False)
    ends = [e for e in data["traceEvents"] if e["ph"] == "e"]
    assert len(ends) == 1 and ends[0]["args"] == {"unfinished": True} and ends[0]["ts"] == pytest.approx(2e6)


# -- schema doc -----------------------------------------------------------------------------------


def test_schema_doc_is_generated_from_the_current_events() -> None:
    run = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "trace_schema_md.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_schema_doc_covers_every_type_and_field() -> None:
    doc = (REPO / "docs" / "trace-schema.md").read_text(encoding="utf-8")
    examples: list[dict] = []
    lines = doc.splitlines()
    for i, text in enumerate(lines):
        if text == "```json":
            examples.append(json.loads(lines[i + 1]))
    assert sorted(e["type"] for e in examples) == sorted(EVENT_TYPES)
    for example in examples:
        validate_event_dict(example)
    for tag, cls in EVENT_TYPES.items():
        section = doc.split(f"## `{tag}`", 1)[1].split("\n## ", 1)[0]
        for f in dataclasses.fields(cls):
            assert f"| `{f.name}` |" in section, f"{tag}.{f.name} undocumented"


def test_format_summary_prints_the_traces_text_without_terminal_controls() -> None:
    """A trace's phase names and error messages reach the report: an ESC there would clear the screen
    or retitle the window, a newline would forge report lines."""
    events = sample_events() + [
        StepEvent(ts=T0 + 9, step=99, phase="\x1b[2J\x1b]0;pwned\x07", batch_size=1, num_tokens=1, host_ms=1.0),
        ErrorEvent(ts=T0 + 9, message="first\nFORGED LINE\x1b[31m", where="w", fatal=True),
    ]
    text = format_summary(summarize(events))
    assert not any(ch in text for ch in "\x1b\x07\r")
    assert "\u241b[2J" in text and "first FORGED LINE\u241b[31m" in text
    assert not any(ln.startswith("FORGED") for ln in text.splitlines())
