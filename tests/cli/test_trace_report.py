"""``graphtop trace report``: one self-contained HTML page holding every chart, fetching nothing, and
one-line errors (exit 2) for bad input."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from graphtop.cli.entry import main
from graphtop.cli.report_html import CHARTS
from graphtop.cli.svg_charts import nice_ticks
from graphtop.engine.telemetry.events import (
    CaptureFinished,
    CaptureProgress,
    CaptureStarted,
    EngineStarted,
    Event,
    KVPoolState,
    RequestFinished,
    RequestFirstToken,
    RequestQueued,
    StepEvent,
)
from graphtop.engine.telemetry.trace_writer import write_trace

MiB = 1 << 20


def _capture(phase: str, buckets: list[int], seconds: float) -> list[Event]:
    out: list[Event] = [CaptureStarted(phase=phase, buckets=tuple(buckets), backend="full", ts=1.0)]
    out += [
        CaptureProgress(
            phase=phase, bucket=b, index=i, total=len(buckets), seconds=seconds * b, memory_bytes=b * MiB, ts=1.1
        )
        for i, b in enumerate(buckets, 1)
    ]
    out.append(CaptureFinished(phase=phase, captured=tuple(buckets), seconds=seconds, ts=1.2))
    return out


def _step(n: int, phase: str, size: int, bucket: int | None, reason: str | None = None) -> StepEvent:
    graph = bucket is not None
    return StepEvent(
        ts=2.0 + n * 0.01,
        step=n,
        phase=phase,
        batch_size=size if phase == "decode" else 1,
        num_tokens=size,
        bucket=bucket,
        padded=(bucket - size) if graph else 0,
        padding_waste=(bucket - size) / bucket if graph else 0.0,
        path="graph" if graph else "eager",
        fallback_reason=reason,
        host_ms=0.3 if graph else 8.0 + n % 3,  # graphs pay off: the advisor keeps graphs
        replay_ms=1.0 + (n % 5) / 10 if graph else None,
    )


def run_events(reason: str = "exceeds_max_bucket") -> list[Event]:
    """A small run: both phases captured, graph and eager steps, KV use, three requests."""
    events: list[Event] = [
        EngineStarted(model="tiny", device="cpu", graph_config={"prefill": {"max_padding_waste": 0.25}})
    ]
    events += _capture("decode", [1, 2, 4, 8], 0.01) + _capture("prefill", [64, 256], 0.002)
    events += [RequestQueued(ts=1.9, request_id=f"r{i}", prompt_tokens=50, max_new_tokens=9) for i in range(3)]
    n = 0
    for size, bucket in [(50, 64), (50, 64), (200, 256)]:
        n += 1
        events.append(_step(n, "prefill", size, bucket))
    for i in range(40):
        n += 1
        size = 1 + i % 7
        bucket = next((b for b in (1, 2, 4, 8) if b >= size), None)
        events.append(_step(n, "decode", size, bucket))
    events += [_step(n + 1, "decode", 12, None, reason), _step(n + 2, "prefill", 900, None, "prefill_eager")]
    events += [KVPoolState(ts=2.0 + i * 0.1, capacity_tokens=1000, used_tokens=100 * i) for i in range(5)]
    for i in range(3):
        events.append(RequestFirstToken(ts=2.1, request_id=f"r{i}", ttft_ms=20.0 + i, queue_ms=2.0 + i))
        events.append(
            RequestFinished(
                ts=2.5, request_id=f"r{i}", output_tokens=9, finish_reason="length", latency_ms=100.0 + 10 * i
            )
        )
    return events


def _write(tmp_path: Path, events: list[Event], name: str = "run.jsonl") -> Path:
    path = tmp_path / name
    write_trace(str(path), events)
    return path


def _report(tmp_path: Path, events: list[Event], capsys: pytest.CaptureFixture[str]) -> str:
    trace = _write(tmp_path, events)
    out = tmp_path / "report.html"
    assert main(["trace", "report", str(trace), "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    return out.read_text(encoding="utf-8")


def _section(page: str, key: str) -> str:
    start = page.index(f'<section id="{key}">')
    return page[start : page.index("</section>", start)]


def test_the_report_holds_every_chart_with_the_traces_numbers(tmp_path, capsys) -> None:
    page = _report(tmp_path, run_events(), capsys)
    for key, heading in CHARTS:
        section = _section(page, key)
        assert html.escape(heading) in section and "<svg " in section, key
        assert "no data in this trace" not in section, key  # each chart drew this run's numbers
    assert "exceeds_max_bucket" in _section(page, "fallbacks") and "prefill_eager" in _section(page, "fallbacks")
    buckets = _section(page, "buckets")
    assert all(f">{b}</text>" for b in (1, 2, 4, 8, 64, 256)) and "decode: padding per bucket" in buckets
    assert (
        "TTFT (3 requests)" in page and "queue time (3 requests)" in page and "inter-token latency (3 requests)" in page
    )
    assert "peak 400 of 1,000 tokens" in _section(page, "kv")
    assert "decode: graph memory" in _section(page, "capture")
    advice = _section(page, "advice")
    assert "decode now" in advice and "decode advice" in advice and "--cuda-graph-config" in advice
    assert "&quot;bs&quot;:[" in advice  # graphs pay off in this run: the advice keeps decode graphs


def test_the_report_fetches_nothing(tmp_path, capsys) -> None:
    page = _report(tmp_path, run_events(), capsys)
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert "http://" not in page and "https://" not in page  # no namespace URL either: nothing to resolve
    for tag in ("<script", "<link", "<img", "<iframe", "@import", "url("):
        assert tag not in page.lower(), tag


def test_trace_text_cannot_add_markup(tmp_path, capsys) -> None:
    page = _report(tmp_path, run_events(reason="<script>alert(1)</script>"), capsys)
    assert "<script" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_a_trace_without_requests_or_steps_still_renders_every_section(tmp_path, capsys) -> None:
    page = _report(tmp_path, [EngineStarted(model="idle")], capsys)
    for key, _ in CHARTS:
        assert "<svg " in _section(page, key)
    assert "No advice: no steps recorded" in page


def test_out_defaults_to_the_traces_name_as_html(tmp_path, capsys) -> None:
    trace = _write(tmp_path, run_events(), "night.jsonl")
    assert main(["trace", "report", str(trace)]) == 0
    assert (tmp_path / "night.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert "night.html" in capsys.readouterr().out


def test_nice_ticks_are_round_and_cover_the_range() -> None:
    assert nice_ticks(0.0, 1000.0) == [0.0, 200.0, 400.0, 600.0, 800.0, 1000.0]
    ticks = nice_ticks(0.013, 0.047)
    assert ticks[0] >= 0.013 and ticks[-1] <= 0.047 and len(ticks) >= 3
    assert nice_ticks(5.0, 5.0) == [5.0]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["trace", "report"], "the following arguments are required: TRACE.jsonl"),
        (["trace", "report", "{missing}", "-o", "{out}"], "cannot read trace"),
        (["trace", "report", "{notatrace}", "-o", "{out}"], "notatrace.jsonl"),
        (["trace", "report", "{trace}", "-o", "{trace}"], "TRACE"),
        (["trace", "report", "{trace}", "-o", "{folder}"], "OUT"),
        (["trace", "report", "{trace}", "-o", "{nodir}"], "OUT"),
        (["trace", "report", "{trace}", "-o", "{out}", "--colour"], "unrecognized arguments"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, argv, message) -> None:
    (tmp_path / "notatrace.jsonl").write_text("hello\n", encoding="utf-8")
    paths = {
        "trace": _write(tmp_path, run_events()),
        "missing": tmp_path / "nope.jsonl",
        "notatrace": tmp_path / "notatrace.jsonl",
        "out": tmp_path / "r.html",
        "folder": tmp_path,
        "nodir": tmp_path / "no" / "such" / "r.html",
    }
    argv = [a.format(**paths) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("graphtop: error: ") and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "r.html").exists()
