"""Fuzz: trace lines. A trace whose lines are valid events with fields replaced by anything (huge or
negative numbers, NaN/Infinity literals, wrong types, lone surrogates, deep nesting) or by arbitrary
JSON/text is either read -- and then summarised, exported to Perfetto as strict JSON and folded into
the dashboard's state without an error -- or refused as one ``path:LINE: message``."""

from __future__ import annotations

import dataclasses
import json

from hypothesis import event, given, settings
from hypothesis import strategies as st
from support.fuzz_support import (
    assert_one_line,
    awkward_text,
    deeply_nested,
    examples,
    json_values,
    no_hang,
    numbers,
    raw_literals,
    to_json,
)

from graphtop.engine.telemetry import events as ev
from graphtop.engine.trace_tools.perfetto import export_perfetto
from graphtop.engine.trace_tools.report import format_summary
from graphtop.engine.trace_tools.summary import summarize
from graphtop.engine.trace_tools.trace import TraceError, read_trace
from graphtop.tui.state import DashboardState

T0 = 1_767_225_600.0
SAMPLES = [
    ev.EngineStarted(
        ts=T0,
        model="m",
        device="cpu",
        dtype="float32",
        graph_config={"decode": {"bs": [1, 2]}},
        locked_keys=("decode.bs",),
    ),
    ev.CaptureStarted(ts=T0 + 1, phase="decode", buckets=(1, 2), backend="full"),
    ev.CaptureProgress(ts=T0 + 2, phase="decode", bucket=2, index=1, total=2, seconds=0.5, memory_bytes=1 << 20),
    ev.CaptureFinished(ts=T0 + 3, phase="decode", captured=(1, 2), seconds=1.0, memory_bytes=2 << 20),
    ev.MemoryLedger(ts=T0 + 4, device="cpu", total=1 << 30, weights=1 << 20, kv_pool=1 << 25),
    ev.KVPoolState(ts=T0 + 5, capacity_tokens=4096, used_tokens=12, running=1, max_running=8),
    ev.RequestQueued(ts=T0 + 6, request_id="r", prompt_tokens=5, max_new_tokens=4),
    ev.StepEvent(
        ts=T0 + 7,
        step=1,
        phase="decode",
        batch_size=1,
        num_tokens=1,
        bucket=2,
        padded=1,
        padding_waste=0.5,
        path="graph",
        host_ms=0.2,
        replay_ms=1.0,
    ),
    ev.RequestFirstToken(ts=T0 + 8, request_id="r", ttft_ms=3.0),
    ev.RequestFinished(ts=T0 + 9, request_id="r", output_tokens=4, finish_reason="length", latency_ms=9.0),
    ev.RecaptureRequested(ts=T0 + 10, decode_bs=(1, 4)),
    ev.RecaptureFinished(ts=T0 + 11, decode_bs=(1, 4), seconds=0.1),
    ev.ConfigDowngrade(ts=T0 + 12, key="decode.max_bs", old=256, new=8, reason="max running"),
    ev.ErrorEvent(ts=T0 + 13, message="boom", where="step"),
]
FIELDS = {type(s): [f.name for f in dataclasses.fields(s)] + ["type", "extra"] for s in SAMPLES}
anything = st.one_of(
    numbers,
    raw_literals,
    awkward_text,
    st.booleans(),
    st.none(),
    json_values,
    deeply_nested,
    st.lists(numbers, max_size=3),
)


@st.composite
def mutated_event(draw: st.DrawFn) -> str:
    sample = draw(st.sampled_from(SAMPLES))
    obj = sample.to_dict()
    for name in draw(st.lists(st.sampled_from(FIELDS[type(sample)]), max_size=3, unique=True)):
        if draw(st.integers(0, 9)) == 0:
            obj.pop(name, None)
        else:
            obj[name] = draw(anything)
    return to_json(obj)


lines = st.one_of(
    mutated_event(),
    mutated_event(),
    st.sampled_from([to_json(s.to_dict()) for s in SAMPLES]),
    json_values.map(to_json),
    st.text(max_size=30),
)
header = st.one_of(
    st.just(to_json(ev.TraceHeader(ts=T0 - 1, meta={"run": "fuzz"}).to_dict())),
    st.builds(
        lambda meta: to_json(ev.TraceHeader(ts=T0 - 1).to_dict() | {"meta": meta}),
        st.one_of(json_values, deeply_nested),
    ),
)


@settings(max_examples=examples(500))
@given(head=header, body=st.lists(lines, max_size=6), cut_tail=st.booleans())
def test_trace_reads_and_every_reader_copes_or_it_is_one_line(tmp_path_factory, head, body, cut_tail):
    path = tmp_path_factory.mktemp("fuzz") / "t.jsonl"
    text = "\n".join([head, *body]) + ("" if cut_tail else "\n")
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    with no_hang():
        try:
            trace = read_trace(path)
        except TraceError as e:
            message = str(e)
            assert_one_line(message)
            assert message.startswith(f"{path}:"), message
            event("refused")
            return
        event("read")
        format_summary(summarize(trace))
        json.dumps(export_perfetto(trace), allow_nan=False)  # strict JSON: what write_perfetto writes
        DashboardState().apply_all(trace.events)
