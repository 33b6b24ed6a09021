"""Odd but decodable event values reach the dashboard (Pilot) without crashing it.

An attached engine's events are decoded by type only, so a buggy or hostile engine can send NaN or
infinite timings and a ``graph_config`` of any shape. The dashboard must keep drawing: non-finite
numbers never reach a chart (Textual's ``Sparkline`` does ``int(nan)``), the tables show "—" for them,
and a malformed graph-config part reads as absent. An export of such events must also open again
(``write_trace`` writes only what ``read_trace`` accepts).
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path
from typing import Any

import pytest

from graphtop.engine.telemetry.events import EngineStarted, RankReplay, RequestFirstToken, StepEvent
from graphtop.engine.telemetry.trace_writer import write_trace
from graphtop.engine.trace_tools.trace import read_trace
from graphtop.tui.app import GraphtopApp
from graphtop.tui.screens.bucket_editor import BucketEditorScreen
from graphtop.tui.sessions.fake import T0, FakeSession, boot_events, step_events
from graphtop.tui.state import DashboardState
from graphtop.tui.testing import FIXED_DEVICE, leave_prompt, screen_text, settle
from graphtop.tui.widgets.steps_table import StepsTable, row_values

SIZE = (160, 48)  # the layout where the replay sparkline is drawn
NAN, INF = float("nan"), float("inf")


def make_app(session: FakeSession) -> GraphtopApp:
    return GraphtopApp(session, poll_device=False, device_sample=FIXED_DEVICE, animate=False, tick_hz=None)


def odd_step(step: int, **values: Any) -> StepEvent:
    fields: dict[str, Any] = dict(
        step=step,
        phase="decode",
        batch_size=1,
        num_tokens=1,
        bucket=1,
        path="graph",
        replay_ms=1.0,
        host_ms=0.5,
        padding_waste=0.0,
        ts=T0 + 20,
    )
    fields.update(values)
    return StepEvent(**fields)


async def test_non_finite_timings_never_reach_the_charts() -> None:
    session = FakeSession(boot_events() + step_events(10))
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        session.publish(
            odd_step(901, replay_ms=NAN),
            odd_step(902, replay_ms=INF, segment_ms=NAN, break_ms=-INF, host_ms=NAN, padding_waste=NAN),
            odd_step(903, replay_ms=-1.0),  # negative: no duration either
            RankReplay(rank=1, steps=(901, 902), replay_ms=(NAN, 2.0), ts=T0 + 20),
            RequestFirstToken(request_id="r", ttft_ms=INF, ts=T0 + 20),
        )
        app.pump()  # the steps panel draws its sparkline and caption here (it crashed on NaN)
        await pilot.pause()
        state = app.state
        assert state.total_steps == 13 and len(state.replay_ms) > 0
        assert all(math.isfinite(v) for v in state.replay_ms)
        assert list(state.rank_replay_ms[1]) == [2.0] and all(math.isfinite(v) for v in state.ttft_ms)
        by_step = {s.step: s for s in state.steps}
        bad = by_step[902]
        assert (bad.replay_ms, bad.segment_ms, bad.break_ms, bad.host_ms, bad.padding_waste) == (
            None,
            None,
            None,
            0.0,
            0.0,
        )
        assert by_step[901].replay_ms is None and by_step[903].replay_ms is None
        assert by_step[1] is next(e for e in state.recorded if getattr(e, "step", None) == 1)  # valid: untouched
        assert row_values(by_step[901])[8] == "—"  # the table's replay column says "no value"
        text = screen_text(app)
        assert not re.search(r"\b(nan|inf|infinity)\b", text, re.I), text
        assert "p50" in text  # the caption still summarises the valid replays
        await leave_prompt(pilot)
        await pilot.press("b")  # the what-if over the steps (the bucket editor) copes too
        await pilot.pause()
        assert isinstance(app.screen, BucketEditorScreen)
        assert app.query_one(StepsTable) is not None


@pytest.mark.parametrize(
    "graph_config",
    [
        {"decode": "x", "prefill": 3},
        {"decode": {"bs": ["abc"], "backend": "full"}, "prefill": {"num_tokens": "512", "max_padding_waste": "big"}},
        {"decode": {"bs": ["abc", 1], "backend": 7}, "prefill": {"num_tokens": [64, True], "max_padding_waste": NAN}},
        {"decode": {"bs": [0, -4]}, "prefill": {"num_tokens": None, "max_padding_waste": -0.5}},
        {"decode": None, "prefill": []},
    ],
    ids=["not-dicts", "strings", "mixed", "out-of-range", "null-and-list"],
)
async def test_malformed_graph_config_reads_as_absent(graph_config: dict) -> None:
    session = FakeSession(boot_events() + step_events(10))
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        session.publish(EngineStarted(model="m", graph_config=graph_config, ts=T0 + 20))
        app.pump()
        await pilot.pause()
        state = app.state
        assert state.graph_max_bucket("decode") is None and state.graph_max_bucket("prefill") is None
        assert state.prefill_padding_cap() is None and state.planned_phases() == []
        await leave_prompt(pilot)
        await pilot.press("b")  # read the static-buffer maxima: crashed with AttributeError / TypeError
        await pilot.pause()
        assert isinstance(app.screen, BucketEditorScreen)


def test_a_well_formed_graph_config_is_read_as_before() -> None:
    state = DashboardState()
    state.apply(
        EngineStarted(
            model="m",
            graph_config={
                "available": True,
                "decode": {"bs": [1, 2, 32], "backend": "full"},
                "prefill": {"num_tokens": [64, 512], "backend": "breakable", "max_padding_waste": 0.5},
            },
        )
    )
    assert (state.graph_max_bucket("decode"), state.graph_max_bucket("prefill")) == (32, 512)
    assert state.prefill_padding_cap() == 0.5 and state.planned_phases() == ["decode", "prefill"]
    assert state.phase_graphs("decode").backend == "full"
    state.apply(
        EngineStarted(
            model="m", graph_config={"decode": {"bs": [1], "backend": "disabled"}, "prefill": {"num_tokens": [64]}}
        )
    )
    assert state.planned_phases() == ["prefill"]
    state.apply(EngineStarted(model="m", graph_config={"available": False, "decode": {"bs": [1]}}))
    assert state.planned_phases() == []


def test_an_export_of_odd_values_opens_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    events = (
        boot_events()
        + step_events(5)
        + [
            odd_step(99, replay_ms=NAN),
            odd_step(100, host_ms=INF),
            RequestFirstToken(request_id="NaN Infinity", ttft_ms=1.0, ts=T0 + 21),  # the spellings inside a string
        ]
    )
    path = tmp_path / "export.jsonl"
    with caplog.at_level(logging.WARNING, logger="graphtop.trace"):
        written = write_trace(path, events)
    assert written == len(events) - 2
    assert "left out 2 event(s) the trace reader would refuse" in caplog.text
    trace = read_trace(path)  # refused the whole file before: "non-finite number NaN"
    assert len(trace.events) == written
    assert trace.events[-1] == events[-1]  # a string that spells NaN is no number: kept
    assert [getattr(e, "step", None) for e in trace.events].count(99) == 0


async def test_the_dashboard_export_says_what_it_left_out(tmp_path: Path) -> None:
    from graphtop.tui.testing import wait_until

    app = make_app(FakeSession(boot_events() + step_events(5) + [odd_step(99, replay_ms=NAN)]))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        target = tmp_path / "export.jsonl"
        app._export_to(str(target))
        await wait_until(pilot, lambda: any(n.title == "trace exported" for n in app._notifications))
        note = next(n.message for n in app._notifications if n.title == "trace exported")
        assert "(1 left out: numbers a trace cannot hold" in note
        assert len(read_trace(target).events) == len(app.state.recorded) - 1
