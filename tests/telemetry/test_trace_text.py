"""Text a trace header holds is text the trace reader takes back (value_limits.readable_text)."""

from __future__ import annotations

import os

import pytest

from graphtop.engine.telemetry.bus import EventBus
from graphtop.engine.telemetry.events import KVPoolState
from graphtop.engine.telemetry.recorder import TraceRecorder
from graphtop.engine.telemetry.trace import read_trace, write_trace
from graphtop.engine.telemetry.value_limits import is_unicode, readable_free, readable_text


@pytest.mark.parametrize("text, readable", [
    ("plain", "plain"),
    ("caf\u00e9 \u2603", "caf\u00e9 \u2603"),
    (os.fsdecode(b"p\xff.jsonl"), "p\\xff.jsonl"),  # a non-UTF-8 argv byte, as Python decodes it
    ("a\ud800b", "a\\ud800b"),  # a surrogate that escapes no byte
    ("\udcff\ud800", "\\udcff\\ud800"),  # both kinds: every surrogate escaped
])
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
