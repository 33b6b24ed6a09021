"""DashboardState folding and ReplaySession timing, without a terminal."""

from __future__ import annotations

import json

import pytest

from graphtop.engine.telemetry.events import (
    CaptureFinished,
    CaptureProgress,
    CaptureStarted,
    ErrorEvent,
    KVPoolState,
    StepEvent,
)
from graphtop.engine.telemetry.trace_writer import write_trace
from graphtop.tui.sessions.fake import FakeSession, boot_events, step_events
from graphtop.tui.sessions.replay import ReplaySession
from graphtop.tui.state import DashboardState


def test_boot_and_steps_fold() -> None:
    st = DashboardState()
    assert st.loading
    st.apply_all(boot_events() + step_events(40))
    assert not st.loading and st.info is not None
    assert st.current_buckets("decode") == [1, 2, 4, 8, 16, 32]
    assert st.capture["prefill"].finished is not None
    assert len(st.bucket_costs()) == 10
    assert st.total_steps == 40 and 0 < st.graph_steps < 40
    assert st.fallbacks.most_common(1)[0][0] == "exceeds_max_bucket"
    assert st.kv is not None and len(st.kv_used) == 1 + 5  # boot + every 8th step
    assert st.revs["steps"] == 40


def test_capture_progress_and_failures() -> None:
    st = DashboardState()
    st.apply(CaptureStarted(phase="decode", buckets=(1, 2, 4), backend="full"))
    st.apply(CaptureProgress(phase="decode", bucket=1, index=1, total=3, seconds=0.1, memory_bytes=10))
    cap = st.capture["decode"]
    assert len(cap.costs) == 1 and cap.total == 3 and cap.finished is None
    st.apply(CaptureProgress(phase="decode", bucket=2, index=2, total=3, ok=False, failure_reason="OOM"))
    assert cap.failed == {2: "OOM"}
    assert ("decode", 2) not in st.costs  # failed captures are no basis for estimates
    st.apply(CaptureFinished(phase="decode", captured=(1,), failed=(2,), ok=False))
    assert st.current_buckets("decode") == [1]


def test_histories_are_bounded() -> None:
    st = DashboardState(step_history=10, spark_history=5, event_history=20)
    st.apply_all(step_events(100))
    assert len(st.steps) == 10 and len(st.replay_ms) == 5 and len(st.recorded) == 20
    assert st.total_steps == 100


def test_recapture_resets_bucket_hits_of_that_phase() -> None:
    st = DashboardState()
    st.apply_all(boot_events() + step_events(30))
    assert any(k[0] == "decode" for k in st.bucket_stats)
    st.apply(CaptureStarted(phase="decode", buckets=(4, 8), reason="recapture"))
    assert not any(k[0] == "decode" for k in st.bucket_stats)
    assert any(k[0] == "prefill" for k in st.bucket_stats)


def test_hits_while_the_first_capture_runs_are_kept() -> None:
    """The engine serves while it captures: steps on buckets already live count for this very pass."""
    st = DashboardState()
    st.apply(CaptureStarted(phase="decode", buckets=(1, 2), reason="initial"))
    st.apply(CaptureProgress(phase="decode", bucket=1, index=1, total=2, seconds=0.1))
    st.apply(StepEvent(step=1, phase="decode", batch_size=1, num_tokens=1, bucket=1, path="graph"))
    st.apply(CaptureFinished(phase="decode", captured=(1, 2)))
    assert ("decode", 1) in st.bucket_stats


def test_fatal_error_marks_failed() -> None:
    st = DashboardState()
    st.apply(ErrorEvent(message="CUDA OOM", where="capture", fatal=True))
    assert st.failed == "CUDA OOM" and not st.loading


def test_emulated_from_steps() -> None:
    st = DashboardState()
    st.apply(StepEvent(step=1, phase="decode", batch_size=1, num_tokens=1, path="graph", emulated=True))
    assert st.emulated


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _trace() -> list:
    return [KVPoolState(capacity_tokens=100, used_tokens=i, ts=1000.0 + i) for i in range(11)]


def test_replay_feeds_in_recorded_time_order() -> None:
    clock = Clock()
    evs = _trace()
    rs = ReplaySession(list(reversed(evs)), clock=clock)  # file order need not be time order
    rs.start()
    assert [e.used_tokens for e in rs.drain()] == [0]
    clock.t += 2.5
    assert [e.used_tokens for e in rs.drain()] == [1, 2]
    assert rs.duration == 10 and rs.position == pytest.approx(2.5)


def test_replay_pause_speed_and_seek() -> None:
    clock = Clock()
    rs = ReplaySession(_trace(), clock=clock)
    rs.start()
    rs.drain()
    rs.toggle_pause()
    clock.t += 5
    assert rs.drain() == [] and rs.position == 0
    rs.toggle_pause()
    rs.change_speed(+1)
    assert rs.speed == 2.0
    clock.t += 2
    assert [e.used_tokens for e in rs.drain()] == [1, 2, 3, 4]
    rs.seek(3)
    assert [e.used_tokens for e in rs.drain()] == [5, 6, 7]
    assert not rs.take_reset()
    rs.seek(-5)
    assert rs.take_reset() and not rs.take_reset()
    assert [e.used_tokens for e in rs.drain()] == [0, 1, 2]
    rs.seek(100)
    rs.drain()
    assert rs.finished and rs.position == rs.duration


def test_replay_seek_events_pauses_and_steps() -> None:
    rs = ReplaySession(_trace(), clock=Clock())
    rs.start()
    rs.drain()
    rs.seek_events(3)
    assert rs.paused
    assert [e.used_tokens for e in rs.drain()] == [1, 2, 3]
    rs.seek_events(-1)
    assert rs.take_reset()
    assert [e.used_tokens for e in rs.drain()] == [0, 1, 2]


def test_export_then_read_back(tmp_path) -> None:
    from graphtop.engine.trace_tools.trace import read_trace

    evs = boot_events() + step_events(10)
    path = tmp_path / "t.jsonl"
    assert write_trace(str(path), evs, meta={"x": 1}) == len(evs)
    trace = read_trace(str(path))
    assert trace.meta == {"x": 1} and len(trace.events) == len(evs)
    assert json.loads(path.read_text().splitlines()[0])["type"] == "header"
    replay = ReplaySession.from_path(str(path))
    assert replay.total == len(evs)


def test_fake_session_records_calls() -> None:
    fs = FakeSession()
    fs.start()
    assert fs.buckets() == ([1, 2, 4, 8, 16, 32], [64, 128, 256, 512])
    fs.recapture([1, 2], None)
    assert fs.buckets()[0] == [1, 2]
    assert fs.recaptures == [([1, 2], None)]
