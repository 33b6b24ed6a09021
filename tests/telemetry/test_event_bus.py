"""EventBus: publish never blocks, drops are counted, filters and fan-out work."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from graphtop.engine.telemetry.bus import EventBus, LoggingSubscriber
from graphtop.engine.telemetry.events import ErrorEvent, KVPoolState, StepEvent


def step(i: int) -> StepEvent:
    return StepEvent(step=i, phase="decode", batch_size=4, num_tokens=4, bucket=4, path="graph")


def test_publish_with_no_subscribers_is_a_noop() -> None:
    bus = EventBus()
    assert not bus.has_subscribers
    for i in range(1000):
        bus.publish(step(i))
    sub = bus.subscribe("late")
    assert bus.has_subscribers
    assert sub.drain() == []


def test_undrained_subscriber_never_blocks_and_counts_drops() -> None:
    bus = EventBus()
    stuck = bus.subscribe("stuck", maxsize=10)
    t0 = time.perf_counter()
    for i in range(10_000):
        bus.publish(step(i))
    elapsed = time.perf_counter() - t0
    assert elapsed < 1.0  # ~µs per publish; a blocking bus would hang here
    assert stuck.pending == 10
    assert stuck.dropped == 9_990
    assert stuck.accepted == 10
    # drop-newest: the queue keeps the oldest events
    assert [e.step for e in stuck.drain()] == list(range(10))
    bus.publish(step(99_999))
    assert [e.step for e in stuck.drain()] == [99_999]


def test_drain_max_items_and_order() -> None:
    bus = EventBus()
    sub = bus.subscribe("s")
    for i in range(5):
        bus.publish(step(i))
    assert [e.step for e in sub.drain(max_items=2)] == [0, 1]
    assert [e.step for e in sub.drain()] == [2, 3, 4]
    assert sub.drain() == []


def test_type_filter() -> None:
    bus = EventBus()
    steps = bus.subscribe("steps", types={"step"})
    others = bus.subscribe("others", types={"kv_pool", "error"})
    bus.publish(step(1))
    bus.publish(KVPoolState(capacity_tokens=100, used_tokens=5))
    bus.publish(ErrorEvent(message="boom"))
    assert [e.type for e in steps.drain()] == ["step"]
    assert [e.type for e in others.drain()] == ["kv_pool", "error"]


def test_unknown_type_filter_rejected() -> None:
    with pytest.raises(ValueError, match="unknown event types"):
        EventBus().subscribe("x", types={"stepp"})


def test_multiple_subscribers_each_get_everything_independently() -> None:
    bus = EventBus()
    a = bus.subscribe("a")
    b = bus.subscribe("b", maxsize=2)
    for i in range(3):
        bus.publish(step(i))
    assert [e.step for e in a.drain()] == [0, 1, 2]
    assert [e.step for e in b.drain()] == [0, 1]
    assert (a.dropped, b.dropped) == (0, 1)


def test_unsubscribe_stops_delivery_and_is_idempotent() -> None:
    bus = EventBus()
    sub = bus.subscribe("s")
    bus.unsubscribe(sub)
    bus.unsubscribe(sub)
    bus.publish(step(1))
    assert sub.drain() == []
    assert sub.closed
    assert not bus.has_subscribers


def test_get_blocks_consumer_until_publish_and_times_out() -> None:
    bus = EventBus()
    sub = bus.subscribe("s")
    assert sub.get(timeout=0.01) is None
    got: list[object] = []
    consumer = threading.Thread(target=lambda: got.append(sub.get(timeout=5)))
    consumer.start()
    time.sleep(0.05)
    bus.publish(step(7))
    consumer.join(5)
    assert not consumer.is_alive()
    assert got[0].step == 7  # type: ignore[attr-defined]


def _raised_by(fn, *args) -> object:
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - the test inspects it
        return e


def test_get_timeout_inf_waits_forever_and_nan_is_refused() -> None:
    """inf waits like None (threading would raise OverflowError); NaN is a one-line ValueError (a NaN
    deadline never passes: the loop spun at 100 % CPU); a negative timeout is still "do not wait"."""
    bus = EventBus()
    sub = bus.subscribe("s")
    for bad, error in ((float("nan"), ValueError), ("1", TypeError)):
        raised: list[BaseException] = []
        waiter = threading.Thread(target=lambda: raised.append(_raised_by(sub.get, bad)), daemon=True)
        waiter.start()
        waiter.join(5)  # a daemon thread: a get that spins forever fails the test instead of hanging it
        assert not waiter.is_alive() and isinstance(raised[0], error)
        assert str(raised[0]).startswith("Subscription.get: timeout must be a number of seconds or None")
        assert "\n" not in str(raised[0])
    assert sub.get(timeout=-1) is None
    got: list[object] = []
    consumer = threading.Thread(target=lambda: got.append(sub.get(timeout=float("inf"))))
    consumer.start()
    time.sleep(0.05)
    bus.publish(step(3))
    consumer.join(5)
    assert not consumer.is_alive() and got[0].step == 3  # type: ignore[attr-defined]


def test_get_returns_none_after_unsubscribe() -> None:
    bus = EventBus()
    sub = bus.subscribe("s")
    got: list[object] = ["sentinel"]
    consumer = threading.Thread(target=lambda: got.__setitem__(0, sub.get()))
    consumer.start()
    time.sleep(0.05)
    bus.unsubscribe(sub)
    consumer.join(5)
    assert not consumer.is_alive()
    assert got[0] is None


def test_producer_consumer_threads_lose_nothing_when_queue_is_big_enough() -> None:
    bus = EventBus()
    sub = bus.subscribe("s", maxsize=100_000)
    received: list[int] = []

    def consume() -> None:
        while True:
            ev = sub.get(timeout=2)
            if ev is None:
                return
            received.append(ev.step)  # type: ignore[attr-defined]

    consumer = threading.Thread(target=consume)
    consumer.start()
    for i in range(20_000):
        bus.publish(step(i))
    bus.unsubscribe(sub)
    consumer.join(10)
    assert received == list(range(20_000))
    assert sub.dropped == 0


def test_maxsize_must_be_positive() -> None:
    with pytest.raises(ValueError):
        EventBus().subscribe("s", maxsize=0)


def test_logging_subscriber_levels(caplog: pytest.LogCaptureFixture) -> None:
    bus = EventBus()
    logger = logging.getLogger("graphtop.test.events")
    caplog.set_level(logging.DEBUG, logger="graphtop.test.events")
    log = LoggingSubscriber(bus, logger=logger).start()
    bus.publish(step(3))
    bus.publish(KVPoolState(capacity_tokens=10, used_tokens=1))
    bus.publish(ErrorEvent(message="bad", fatal=True))
    log.stop()
    levels = {r.getMessage().split()[0]: r.levelno for r in caplog.records if r.name == logger.name}
    assert levels == {"step": logging.DEBUG, "kv_pool": logging.INFO, "error": logging.ERROR}


def test_logging_subscriber_skips_steps_when_debug_disabled() -> None:
    bus = EventBus()
    logger = logging.getLogger("graphtop.test.quiet")
    logger.setLevel(logging.INFO)
    log = LoggingSubscriber(bus, logger=logger).start()
    assert log.subscription is not None and "step" not in (log.subscription.types or set())
    bus.publish(step(1))
    assert log.subscription.accepted == 0
    log.stop()


def test_fast_constructor_builds_the_same_event():
    """The engine's hot-path constructor must give exactly what the dataclass would."""
    from graphtop.engine.telemetry.events import KVPoolState, StepEvent, validate_event_dict

    kw = dict(
        step=3,
        phase="decode",
        batch_size=5,
        num_tokens=5,
        bucket=8,
        padded=3,
        padding_waste=0.375,
        path="graph",
        fallback_reason=None,
        host_ms=1.5,
        replay_ms=1.2,
        segment_ms=None,
        break_ms=None,
        emulated=True,
        forward_ms=None,
        launch_ms=None,
    )
    a, b = StepEvent(ts=7.0, **kw), StepEvent.fast(ts=7.0, **kw)
    assert a == b and hash(a) == hash(b) and type(b) is StepEvent
    assert b.to_dict() == a.to_dict()
    validate_event_dict(b.to_dict())
    k = KVPoolState.fast(capacity_tokens=10, used_tokens=4, page_size=1, running=1, queued=0, max_running=8)
    assert k.ts > 0 and validate_event_dict(k.to_dict()) is KVPoolState
