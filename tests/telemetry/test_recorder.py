"""TraceRecorder: valid lines, crash safety, clear errors, write failures isolated from the engine."""

from __future__ import annotations

import errno
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from graphtop.engine.telemetry.bus import EventBus
from graphtop.engine.telemetry.events import (
    KVPoolState,
    RequestFinished,
    StepEvent,
    validate_event_dict,
)
from graphtop.engine.telemetry.recorder import RecorderError, TraceRecorder
from graphtop.engine.trace_tools.trace import read_trace


def step(i: int) -> StepEvent:
    return StepEvent(
        step=i,
        phase="decode",
        batch_size=3,
        num_tokens=3,
        bucket=4,
        padded=1,
        padding_waste=0.25,
        path="graph",
        host_ms=0.5,
        replay_ms=0.2,
    )


def test_every_line_validates_and_counts(tmp_path: Path) -> None:
    bus = EventBus()
    path = tmp_path / "run.jsonl"
    rec = TraceRecorder(path, bus, {"model": "tiny", "argv": ["x"]})
    for i in range(500):
        bus.publish(step(i))
    bus.publish(KVPoolState(capacity_tokens=100, used_tokens=10))
    bus.publish(RequestFinished(request_id="r1", output_tokens=5, finish_reason="stop"))
    result = rec.close()

    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""  # file ends with a newline
    objs = [json.loads(line) for line in lines[:-1]]
    for obj in objs:
        validate_event_dict(obj)
    assert objs[0]["type"] == "header" and objs[0]["meta"]["model"] == "tiny"
    assert b", " not in lines[1]  # compact separators
    assert result.lines_written == len(objs) == 503
    assert result.bytes_written == path.stat().st_size
    assert result.counts == {"header": 1, "step": 500, "kv_pool": 1, "request_finished": 1}
    assert result.write_error is None and result.dropped == 0 and result.ok
    assert [e.step for e in read_trace(path).events if isinstance(e, StepEvent)] == list(range(500))


def test_close_is_idempotent_and_unsubscribes(tmp_path: Path) -> None:
    bus = EventBus()
    rec = TraceRecorder(tmp_path / "t.jsonl", bus, {})
    first = rec.close()
    assert rec.close() is first
    assert not bus.has_subscribers


def test_missing_directory_is_one_line_error(tmp_path: Path) -> None:
    bus = EventBus()
    with pytest.raises(RecorderError) as info:
        TraceRecorder(tmp_path / "nope" / "t.jsonl", bus, {})
    msg = str(info.value)
    assert "\n" not in msg and "nope" in msg and "does not exist" in msg
    assert not bus.has_subscribers


def test_directory_path_is_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(RecorderError) as info:
        TraceRecorder(tmp_path, EventBus(), {})
    assert "\n" not in str(info.value) and "directory" in str(info.value).lower()


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores permissions")
def test_permission_denied_is_one_line_error(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(RecorderError, match="not writable"):
            TraceRecorder(locked / "t.jsonl", EventBus(), {})
    finally:
        locked.chmod(0o700)


def test_permission_error_from_opener_is_recorder_error(tmp_path: Path) -> None:
    def opener(path: Path) -> io.RawIOBase:
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    with pytest.raises(RecorderError, match="EACCES: Permission denied"):
        TraceRecorder(tmp_path / "t.jsonl", EventBus(), {}, opener=opener)


class FailingFile(io.RawIOBase):
    """Accepts ``ok_writes`` writes, then fails every write with ENOSPC (a full disk)."""

    def __init__(self, ok_writes: int) -> None:
        self.ok_writes = ok_writes
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b: bytes) -> int:  # type: ignore[override]
        if self.ok_writes <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.ok_writes -= 1
        self.data += bytes(b)
        return len(b)


def test_write_error_mid_run_is_recorded_not_raised(tmp_path: Path) -> None:
    bus = EventBus()
    fake = FailingFile(ok_writes=1)  # the header succeeds, the first batch of events fails
    rec = TraceRecorder(tmp_path / "t.jsonl", bus, {}, opener=lambda p: fake)  # type: ignore[arg-type,return-value]
    for i in range(100):
        bus.publish(step(i))  # must never raise into the publisher
    deadline = time.monotonic() + 5
    while rec.write_error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    for i in range(100, 200):
        bus.publish(step(i))  # after the failure the recorder has unsubscribed: still no exception
    result = rec.close()
    assert result.write_error is not None and "ENOSPC" in result.write_error
    assert not result.ok
    assert result.lines_written == 1  # just the header
    assert result.lost_after_error >= 1
    assert "WRITE FAILED" in result.describe()
    assert fake.data.count(b"\n") == 1


def test_header_write_failure_is_recorder_error(tmp_path: Path) -> None:
    fake = FailingFile(ok_writes=0)
    with pytest.raises(RecorderError, match="ENOSPC"):
        TraceRecorder(tmp_path / "t.jsonl", EventBus(), {}, opener=lambda p: fake)  # type: ignore[arg-type,return-value]


def test_full_queue_counts_drops(tmp_path: Path) -> None:
    bus = EventBus()
    rec = TraceRecorder(tmp_path / "t.jsonl", bus, {}, maxsize=1)
    for i in range(20_000):
        bus.publish(step(i))
    result = rec.close()
    assert result.dropped == rec.dropped
    assert result.lines_written == 1 + 20_000 - result.dropped
    assert len(read_trace(tmp_path / "t.jsonl").events) == 20_000 - result.dropped


_WRITER = textwrap.dedent(
    """
    import sys
    from graphtop.engine.telemetry.bus import EventBus
    from graphtop.engine.telemetry.events import StepEvent
    from graphtop.engine.telemetry.recorder import TraceRecorder

    bus = EventBus()
    rec = TraceRecorder(sys.argv[1], bus, {"test": "sigkill"})
    i = 0
    while True:
        bus.publish(StepEvent(step=i, phase="decode", batch_size=8, num_tokens=8, bucket=8,
                              path="graph", host_ms=0.1, replay_ms=0.05,
                              fallback_reason="x" * (i % 300)))
        i += 1
    """
)


def test_sigkill_leaves_a_readable_trace(tmp_path: Path) -> None:
    path = tmp_path / "killed.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)])
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if path.exists() and path.stat().st_size > 200_000:
                break
            if proc.poll() is not None:
                pytest.fail(f"writer exited early with {proc.returncode}")
            time.sleep(0.01)
        else:
            pytest.fail("writer produced too little output")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert proc.returncode == -signal.SIGKILL
    trace = read_trace(path)  # a truncated last line is allowed; nothing else may be damaged
    assert trace.header.meta == {"test": "sigkill"}
    steps = [e.step for e in trace.events if isinstance(e, StepEvent)]
    assert len(steps) > 100
    assert steps == sorted(steps)


def test_truncated_last_line_is_tolerated(tmp_path: Path) -> None:
    bus = EventBus()
    path = tmp_path / "t.jsonl"
    rec = TraceRecorder(path, bus, {})
    for i in range(10):
        bus.publish(step(i))
    rec.close()
    data = path.read_bytes()
    path.write_bytes(data[:-25])  # cut the last line in half, as a kill mid-write would
    trace = read_trace(path)
    assert trace.truncated_tail
    assert len(trace.events) == 9


def test_unpublished_trace_is_discarded_and_the_older_file_kept(tmp_path: Path) -> None:
    """A run that never starts (the CLI while the model loads) must not destroy an older trace."""
    target = tmp_path / "t.jsonl"
    target.write_text("an older trace\n")
    bus = EventBus()
    rec = TraceRecorder(target, bus, {"run": 1}, publish=False)
    bus.publish(step(0))
    rec.discard()
    assert target.read_text() == "an older trace\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl"]  # no temporary left behind


def test_published_trace_is_at_its_path_while_recording(tmp_path: Path) -> None:
    target = tmp_path / "t.jsonl"
    target.write_text("an older trace\n")
    bus = EventBus()
    rec = TraceRecorder(target, bus, {"run": 2}, publish=False)
    rec.publish()
    for i in range(3):
        bus.publish(step(i))
    deadline = time.monotonic() + 5
    while rec.lines_written < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert target.read_text().count("\n") == 4  # readable at its path before close
    result = rec.close()
    assert result.ok and [e.type for e in read_trace(target).events] == ["step"] * 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl"]


def test_close_publishes_a_staged_trace(tmp_path: Path) -> None:
    target = tmp_path / "t.jsonl"
    rec = TraceRecorder(target, EventBus(), {}, publish=False)
    assert not target.exists()
    assert rec.close().ok and read_trace(target).header.meta == {}


def test_a_second_recorder_refuses_a_trace_still_being_written(tmp_path: Path) -> None:
    target = tmp_path / "t.jsonl"
    first = TraceRecorder(target, EventBus(), {"run": 1})
    for publish in (True, False):  # at once, or staged for later: refused up front either way
        with pytest.raises(RecorderError, match="another graphtop run is still recording to it"):
            TraceRecorder(target, EventBus(), {"run": 2}, publish=publish)
    assert first.close().ok
    assert TraceRecorder(target, EventBus(), {"run": 3}).close().ok  # once the first is done
    assert read_trace(target).header.meta == {"run": 3}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl"]


def test_a_staged_trace_is_not_published_over_a_live_one(tmp_path: Path) -> None:
    target = tmp_path / "t.jsonl"
    second = TraceRecorder(target, EventBus(), {"run": 2}, publish=False)
    first = TraceRecorder(target, EventBus(), {"run": 1})
    with pytest.raises(RecorderError, match="still recording"):
        second.publish()
    second.discard()
    assert first.close().ok and read_trace(target).header.meta == {"run": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl"]


@pytest.mark.parametrize(
    "change,reason",
    [
        (lambda target, other: os.replace(other, target), "another file replaced it while recording"),
        (lambda target, other: os.replace(target, other), "it was moved or removed while recording"),
    ],
)
def test_a_trace_replaced_or_moved_while_recording_is_a_write_error(tmp_path: Path, change, reason) -> None:
    target, other = tmp_path / "t.jsonl", tmp_path / "other.jsonl"
    other.write_text("another run's trace\n")
    rec = TraceRecorder(target, EventBus(), {})
    change(target, other)
    result = rec.close()
    assert not result.ok and result.write_error is not None and result.write_error.startswith(reason)
    assert result.error_line == f"cannot write trace {target}: {result.write_error}"


def test_an_interrupt_while_starting_leaves_no_staged_file(tmp_path: Path, monkeypatch) -> None:
    from graphtop.engine.telemetry import recorder

    def interrupted(*a: object) -> bytes:
        raise KeyboardInterrupt

    monkeypatch.setattr(recorder, "encode_event", interrupted)
    with pytest.raises(KeyboardInterrupt):
        TraceRecorder(tmp_path / "t.jsonl", EventBus(), {}, publish=False)
    assert list(tmp_path.iterdir()) == []


class ShortFile(FailingFile):
    """Takes ``room`` bytes in all (a short write for the one that crosses it), then fails: a file size
    limit (EFBIG) reached part-way through a batch."""

    def __init__(self, room: int) -> None:
        super().__init__(ok_writes=10**9)
        self.room = room

    def write(self, b: bytes) -> int:  # type: ignore[override]
        if self.room <= 0:
            raise OSError(errno.EFBIG, "File too large")
        taken = bytes(b)[: self.room]
        self.room -= len(taken)
        self.data += taken
        return len(taken)


def test_lines_that_reached_the_file_before_a_write_error_are_counted(tmp_path: Path) -> None:
    """The CLI said "trace t.jsonl: 1 lines" of a trace holding ~50 whole lines when EFBIG cut a batch."""
    bus = EventBus()
    fake = ShortFile(room=4096)
    rec = TraceRecorder(tmp_path / "t.jsonl", bus, {}, opener=lambda p: fake)  # type: ignore[arg-type,return-value]
    for i in range(200):
        bus.publish(step(i))
    result = rec.close()
    whole = fake.data.count(b"\n")
    assert "EFBIG" in result.write_error and whole > 10
    assert result.lines_written == whole and result.bytes_written == 4096 == len(fake.data)
    assert result.lost_after_error >= 1 and result.lines_written - 1 + result.lost_after_error <= 200
