"""Text a trace header holds is text the trace reader takes back (value_limits.readable_text)."""

from __future__ import annotations

import os

import pytest

from graphtop.engine.telemetry.bus import EventBus
from graphtop.engine.telemetry.events import KVPoolState
from graphtop.engine.telemetry.recorder import TraceRecorder
from graphtop.engine.telemetry.trace_writer import write_trace
from graphtop.engine.telemetry.value_limits import is_unicode, readable_free, readable_text
from graphtop.engine.trace_tools.trace import read_trace


@pytest.mark.parametrize(
    "text, readable",
    [
        ("plain", "plain"),
        ("caf\u00e9 \u2603", "caf\u00e9 \u2603"),
        (os.fsdecode(b"p\xff.jsonl"), "p\\xff.jsonl"),  # a non-UTF-8 argv byte, as Python decodes it
        ("a\ud800b", "a\\ud800b"),  # a surrogate that escapes no byte
        ("\udcff\ud800", "\\udcff\\ud800"),  # both kinds: every surrogate escaped
    ],
)
def test_readable_text_escapes_lone_surrogates_only(text, readable):
    assert readable_text(text) == readable and is_unicode(readable)


def test_readable_free_reaches_keys_and_nested_values():
    bad = os.fsdecode(b"\xfe")
    meta = {"argv": ["--prompts", f"p{bad}"], bad: {"n": 3, "t": (bad, 1.5)}}
    assert readable_free(meta) == {"argv": ["--prompts", "p\\xfe"], "\\xfe": {"n": 3, "t": ("\\xfe", 1.5)}}


@pytest.mark.parametrize("writer", ["recorder", "export"])
def test_a_header_meta_with_lone_surrogates_reads_back(tmp_path, writer):
    path, meta = tmp_path / "t.jsonl", {"argv": [os.fsdecode(b"x\xff"), "y\ud800"]}
    event = KVPoolState(capacity_tokens=10, used_tokens=1)
    if writer == "recorder":
        bus = EventBus()
        rec = TraceRecorder(path, bus, meta)
        bus.publish(event)
        rec.close()
    else:
        write_trace(path, [event], meta=meta)
    trace = read_trace(path)
    assert trace.header.meta["argv"] == ["x\\xff", "y\\ud800"] and len(trace.events) == 1


UNSAFE = "\x1b\x9b\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


@pytest.mark.parametrize("command", ["trace summary", "advise"])
def test_text_reports_show_no_terminal_or_bidi_controls(tmp_path, capsys, command):
    """``graphtop trace summary`` printed a right-to-left override (U+202E) from a trace as it was: a
    terminal then showed the line's end reversed. Every control (C0, C1, bidi) is a stand-in now."""
    from graphtop.cli.entry import main
    from graphtop.engine.telemetry.events import EngineStarted, ErrorEvent, StepEvent

    sly = "evil\u202etxt.exe \x1b]0;t\x07 \x9b31m \u2066x\u2069"
    events = [EngineStarted(model=sly, device="cpu", ts=1.0), ErrorEvent(message=sly, where=sly, ts=2.0)]
    events += [
        StepEvent(
            step=i,
            phase="decode",
            batch_size=2,
            num_tokens=2,
            path="eager",
            fallback_reason=sly,
            host_ms=1.0,
            ts=3.0 + i,
        )
        for i in range(1, 4)
    ]
    path = tmp_path / "evil\u202etxt.exe\x1b[31m\u2067.jsonl"  # both reports name the trace
    write_trace(path, events)
    assert main([*command.split(), str(path)]) == 0
    out = capsys.readouterr().out
    assert "evil\ufffdtxt.exe\u241b[31m\ufffd.jsonl" in out  # the text is there, its controls as stand-ins
    assert not any(c in out for c in UNSAFE), [hex(ord(c)) for c in out if c in UNSAFE]
