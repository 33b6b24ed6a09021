"""encode_event (generated per-class encoders) writes exactly what the plain json path writes."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from graphtop.engine.telemetry import codec, recorder
from graphtop.engine.telemetry.bus import EventBus
from graphtop.engine.telemetry.codec import encode_event
from graphtop.engine.telemetry.events import (
    EVENT_TYPES,
    ConfigDowngrade,
    Event,
    KVPoolState,
    StepEvent,
    TraceHeader,
)
from graphtop.engine.telemetry.recorder import TraceRecorder


def reference(event: Event) -> bytes:
    """Today's specification, spelled out independently of the recorder module."""
    enc = json.JSONEncoder(separators=(",", ":"), default=str)
    return (enc.encode(event.to_dict()) + "\n").encode("utf-8")


class Color(str, enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    LOW = 1  # == True: must still be written as 1
    HIGH = 3


class Flag(enum.IntFlag):
    A = 1
    B = 2


class MyStr(str):
    def __str__(self) -> str:  # json ignores this for a str subclass; the fast path must as well
        return "not-this"


class MyInt(int):
    def __repr__(self) -> str:
        return "not-this"


class MyFloat(float):
    def __repr__(self) -> str:
        return "not-this"


class Opaque:
    def __str__(self) -> str:
        return 'opaque "object" \u00e9'


SCALARS: list[Any] = [
    None,
    True,
    False,
    0,
    1,
    -1,
    7,
    2**31,
    -(2**63),
    2**64,
    10**30,
    -(10**40),
    0.0,
    -0.0,
    1.0,
    -1.5,
    0.1 + 0.2,
    1e16,
    1e-7,
    5e-324,
    1.7976931348623157e308,
    1796026166.1865034,
    float("nan"),
    float("inf"),
    float("-inf"),
    "",
    "decode",
    'quo"te',
    "back\\slash",
    "sl/ash",
    "\n\t\r\b\f",
    "\x00\x01\x1f\x7f",
    "caf\u00e9",
    "\u65e5\u672c",
    "\U0001f600",
    "\ud800",
    "\u2028\u2029",
    "{a0}",
    "{}",
    "}{",
    "\0\1",
    "'single'",
]
SUBCLASSES: list[Any] = [
    Color.RED,
    Level.LOW,
    Level.HIGH,
    Flag.A | Flag.B,
    MyStr("sub\u00e9"),
    MyInt(1),
    MyInt(0),
    MyFloat(1.0),
    MyFloat(-0.0),
    MyFloat("-inf"),
    MyFloat("nan"),
]
CONTAINERS: list[Any] = [
    (),
    (1, 2, 3),
    ("a", None, 1.5),
    ((1, "x"), (float("inf"),)),
    [1, (2, 3), {"k": (4,)}],
    {},
    {"a": 1, "b": [1, 2], "c": {"d": None}},
    {1: "int key", None: "none key", 1.5: "float", False: "f"},
    {"t": (1, (2, (3,)))},
    {"obj": Opaque(), "dc": KVPoolState(capacity_tokens=3, ts=1.0)},
    KVPoolState(capacity_tokens=8, used_tokens=2, ts=2.5),
]
OTHERS: list[Any] = [Opaque(), Path("/tmp/x y"), b"bytes", {1, 2}, KVPoolState, complex(1, 2)]
ALL_VALUES = SCALARS + SUBCLASSES + CONTAINERS + OTHERS


def fields_of(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def assert_same(event: Event) -> bytes:
    got = encode_event(event)
    want = reference(event)
    assert got == want, f"{type(event).__name__}: {got!r} != {want!r}"
    return got


def test_every_event_type_is_covered() -> None:
    assert len(EVENT_TYPES) >= 15 and StepEvent in EVENT_TYPES.values()


@pytest.mark.parametrize("cls", list(EVENT_TYPES.values()), ids=list(EVENT_TYPES))
def test_defaults_match_reference_and_round_trip(cls: type[Event]) -> None:
    event = cls()
    line = assert_same(event)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == event.to_dict()
    assert list(json.loads(line)) == ["type", *fields_of(cls)]  # key order: type, then fields


@pytest.mark.parametrize("cls", list(EVENT_TYPES.values()), ids=list(EVENT_TYPES))
def test_any_value_in_any_field_matches_reference(cls: type[Event]) -> None:
    # Annotations are not enforced at runtime, so every field gets every kind of value.
    checked = 0
    for name in fields_of(cls):
        for value in ALL_VALUES:
            event = cls(**{name: value})
            line = assert_same(event)
            assert line.isascii()
            checked += 1
    assert checked == len(fields_of(cls)) * len(ALL_VALUES)


@pytest.mark.parametrize("cls", list(EVENT_TYPES.values()), ids=list(EVENT_TYPES))
def test_json_native_values_parse_back_to_to_dict(cls: type[Event]) -> None:
    for name in fields_of(cls):
        for value in SCALARS + SUBCLASSES[:-1] + CONTAINERS[:3] + CONTAINERS[5:7]:
            event = cls(**{name: value})
            parsed = json.loads(encode_event(event))
            expected = event.to_dict()
            if isinstance(value, float) and math.isnan(value):
                assert math.isnan(parsed[name])
                parsed[name] = expected[name] = None
            assert parsed == expected, (cls.__name__, name, value)


def test_all_fields_tricky_at_once() -> None:
    ev = StepEvent.fast(
        step=2**70,
        phase="pr\u00e9fill\n",
        batch_size=True,
        num_tokens=Level.HIGH,
        bucket=None,
        padded=-0.0,
        padding_waste=float("nan"),
        path=Color.RED,
        fallback_reason='why "not"',
        host_ms=float("-inf"),
        replay_ms=1e-300,
        segment_ms=(1, 2),
        break_ms={"x": None},
        emulated=None,
        forward_ms=-1e308,
        launch_ms=None,
        ts=float("inf"),
    )
    line = assert_same(ev)
    assert line.startswith(b'{"type":"step","ts":Infinity,"step":1180591620717411303424,"phase":"pr\\u00e9fill\\n"')
    header = TraceHeader(meta={"argv": ["--x", "\u00fc"], "nested": {"t": (1, 2)}, "obj": Opaque()}, ts=0.5)
    assert_same(header)
    downgrade = ConfigDowngrade(key="k", old=(1, {"a": Color.RED}), new=Flag.B, reason="\x07", ts=-0.0)
    assert_same(downgrade)


def test_fast_constructor_events_match() -> None:
    ev = StepEvent.fast(
        step=1234,
        phase="decode",
        batch_size=8,
        num_tokens=8,
        bucket=8,
        padded=0,
        padding_waste=0.0,
        path="graph",
        fallback_reason=None,
        host_ms=0.1234,
        replay_ms=0.0567,
        segment_ms=None,
        break_ms=None,
        emulated=True,
        forward_ms=None,
        launch_ms=None,
    )
    line = assert_same(ev)
    assert json.loads(line) == ev.to_dict()


def test_common_events_skip_to_dict(monkeypatch: pytest.MonkeyPatch) -> None:
    """The point of the generated encoders: a plain event never goes through to_dict()/json."""
    ev = StepEvent(
        step=3,
        phase="decode",
        batch_size=1,
        num_tokens=1,
        bucket=1,
        padding_waste=0.5,
        path="graph",
        host_ms=0.25,
        replay_ms=0.125,
    )
    want = reference(ev)

    def boom(self: Event) -> dict:
        raise AssertionError("slow path taken")

    monkeypatch.setattr(Event, "to_dict", boom)
    monkeypatch.setattr(codec, "_ENCODER", None)  # the generic encoder is not touched either
    assert encode_event(ev) == want
    assert codec._LINE_ENCODERS[StepEvent] is not codec._reference_line


def test_shadowed_type_tag_still_matches() -> None:
    ev = StepEvent.fast(
        step=1,
        phase="decode",
        batch_size=1,
        num_tokens=1,
        bucket=None,
        padded=0,
        padding_waste=0.0,
        path="eager",
        fallback_reason=None,
        host_ms=0.0,
        replay_ms=None,
        segment_ms=None,
        break_ms=None,
        emulated=False,
        forward_ms=None,
        launch_ms=None,
        type="other",
    )
    line = assert_same(ev)
    assert line.startswith(b'{"type":"other",')


def test_subclass_of_an_event_gets_its_own_encoder() -> None:
    @dataclasses.dataclass(frozen=True)
    class Extended(KVPoolState):
        type = "kv_pool_ext"  # not a ClassVar annotation: a plain class attribute
        extra: tuple[int, ...] = (1, 2)
        note: str | None = None

    for value in ALL_VALUES:
        assert_same(Extended(extra=value, note=value, used_tokens=value))
    assert_same(KVPoolState(used_tokens=4))
    assert codec._LINE_ENCODERS[Extended] is not codec._LINE_ENCODERS[KVPoolState]


def test_unencodable_value_fails_like_the_reference() -> None:
    loop: list[Any] = []
    loop.append(loop)  # lists are left to json, which detects the cycle
    for ev in (TraceHeader(meta={"loop": loop}), ConfigDowngrade(old=loop)):
        with pytest.raises(ValueError) as want:
            reference(ev)
        with pytest.raises(ValueError) as got:
            encode_event(ev)
        assert str(got.value) == str(want.value) == "Circular reference detected"
    selfref: dict[str, Any] = {}
    selfref["self"] = selfref  # dicts are converted by _jsonable first, which recurses
    with pytest.raises(RecursionError):
        reference(TraceHeader(meta=selfref))
    with pytest.raises(RecursionError):
        encode_event(TraceHeader(meta=selfref))


def test_recorder_file_is_the_reference_encoding(tmp_path: Path) -> None:
    bus = EventBus()
    path = tmp_path / "t.jsonl"
    rec = TraceRecorder(path, bus, {"model": "m\u00e9", "argv": ("a", "b")})
    events: list[Event] = []
    for i in range(300):  # several write batches
        events.append(
            StepEvent.fast(
                step=i,
                phase="decode",
                batch_size=i % 5,
                num_tokens=i % 5,
                bucket=None if i % 7 else 8,
                padded=i % 3,
                padding_waste=i / 7,
                path="graph",
                fallback_reason=None if i % 2 else "no \u2603",
                host_ms=i * 0.001,
                replay_ms=None,
                segment_ms=float("nan"),
                break_ms=None,
                emulated=bool(i % 2),
                forward_ms=None,
                launch_ms=0.25,
            )
        )
    events.append(KVPoolState(capacity_tokens=10, used_tokens=3))
    events.append(ConfigDowngrade(key="k", old=(1, 2), new={"x": Opaque()}, reason="r"))
    for e in events:
        bus.publish(e)
    result = rec.close()
    lines = path.read_bytes().splitlines(keepends=True)
    assert len(lines) == 1 + len(events) == result.lines_written
    assert json.loads(lines[0])["meta"] == {"model": "m\u00e9", "argv": ["a", "b"]}
    assert lines[1:] == [reference(e) for e in events]
    assert result.counts == {"header": 1, "step": 300, "kv_pool": 1, "config_downgrade": 1}
    assert result.bytes_written == path.stat().st_size


class CountingEvent(threading.Event):
    def __init__(self) -> None:
        super().__init__()
        self.sets = 0

    def set(self) -> None:
        self.sets += 1
        super().set()


def test_steady_stream_does_not_make_the_publisher_wake_the_recorder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a steady stream the recorder polls once per flush interval; the engine thread's publish
    only pays for waking it (Event.set) when the stream pauses for a whole interval."""
    monkeypatch.setattr(threading, "Event", CountingEvent)
    bus = EventBus()
    path = tmp_path / "t.jsonl"
    rec = TraceRecorder(path, bus, {})
    wakeup = rec.subscription._wakeup
    assert isinstance(wakeup, CountingEvent)
    n = 300
    start = time.perf_counter()
    for i in range(n):  # ~1 event per ms for ~12 flush intervals
        bus.publish(StepEvent(step=i))
        while time.perf_counter() < start + (i + 1) * 1e-3:
            time.sleep(0.0002)
    intervals = (time.perf_counter() - start) / recorder.FLUSH_INTERVAL_S
    result = rec.close()
    assert result.lines_written == n + 1 and result.ok
    assert [json.loads(line)["step"] for line in path.read_bytes().splitlines()[1:]] == list(range(n))
    # One set for the first event; blocking in get() after every batch would make it ~one per interval.
    assert intervals >= 10
    assert wakeup.sets <= 3, (wakeup.sets, intervals)
