"""Random engine event streams for property tests of the fold and its readers: every event type the
fold folds, with the awkward cases mixed in (steps of three phases, eager steps with and without a
reason, requests finished without being queued or with a first token only, capture passes of two
ranks that start mid-pass, the endpoint's refusals among the engine's errors)."""

from __future__ import annotations

from hypothesis import strategies as st

from graphtop.engine.telemetry import events as ev
from graphtop.engine.telemetry.fold import REFUSAL_WHERE

PHASES = ("decode", "prefill", "mixed")
REQUESTS = tuple(f"r{i}" for i in range(6))
BUCKETS = (1, 2, 4, 8, 64)
ms = st.floats(min_value=0.0, max_value=50.0, allow_nan=False)

steps = st.builds(
    ev.StepEvent,
    step=st.integers(1, 200),
    phase=st.sampled_from(PHASES),
    batch_size=st.integers(1, 8),
    num_tokens=st.integers(1, 64),
    bucket=st.none() | st.sampled_from(BUCKETS),
    padded=st.integers(0, 7),
    padding_waste=st.floats(0.0, 1.0),
    path=st.sampled_from(("graph", "eager")),
    fallback_reason=st.sampled_from((None, "", "no_bucket", "capturing")),
    host_ms=ms,
    replay_ms=st.none() | ms,
    emulated=st.booleans(),
)
requests = st.one_of(
    st.builds(ev.RequestQueued, request_id=st.sampled_from(REQUESTS), prompt_tokens=st.integers(0, 99)),
    st.builds(ev.RequestFirstToken, request_id=st.sampled_from(REQUESTS), ttft_ms=ms),
    st.builds(
        ev.RequestFinished,
        request_id=st.sampled_from(REQUESTS),
        output_tokens=st.integers(0, 20),
        finish_reason=st.sampled_from(("length", "eos", "rejected", "")),
        latency_ms=st.floats(0.0, 500.0),
        error=st.none() | st.just("boom"),
    ),
)
rank = st.sampled_from((0, 0, 1))
phase2 = st.sampled_from(("decode", "prefill"))
captures = st.one_of(
    st.builds(
        ev.CaptureStarted,
        phase=phase2,
        buckets=st.lists(st.sampled_from(BUCKETS), max_size=3, unique=True).map(tuple),
        reason=st.sampled_from(("initial", "recapture")),
        rank=rank,
    ),
    st.builds(
        ev.CaptureProgress,
        phase=phase2,
        bucket=st.sampled_from(BUCKETS),
        seconds=ms,
        memory_bytes=st.integers(0, 10**6),
        ok=st.booleans(),
        rank=rank,
    ),
    st.builds(
        ev.CaptureFinished,
        phase=phase2,
        captured=st.lists(st.sampled_from(BUCKETS), max_size=3, unique=True).map(tuple),
        rank=rank,
    ),
)
others = st.one_of(
    st.builds(ev.EngineStarted, model=st.sampled_from(("a", "b")), emulated=st.booleans()),
    st.builds(ev.LoadProgress, label=st.just("converting"), done=st.integers(0, 9)),
    st.builds(ev.MemoryLedger, total=st.integers(0, 10**9), rank=rank),
    st.builds(ev.KVPoolState, capacity_tokens=st.integers(0, 4096), used_tokens=st.integers(0, 4096)),
    st.builds(ev.RecaptureRequested, decode_bs=st.just((1, 2)), cause=st.sampled_from(("manual", "auto_tune", ""))),
    st.builds(ev.RecaptureFinished, ok=st.booleans()),
    st.builds(ev.ConfigDowngrade, key=st.just("decode.bs")),
    st.builds(
        ev.ErrorEvent,
        message=st.just("x"),
        where=st.sampled_from(("step", "", REFUSAL_WHERE)),
        fatal=st.booleans(),
        rank=st.none() | rank,
    ),
    st.builds(ev.ParityCheck, phase=phase2, mismatch=st.booleans(), max_rel_err=st.floats(0.0, 1.0)),
    st.builds(ev.ParityNotRun, reason=st.just("discarded"), skipped=st.integers(0, 3)),
    st.builds(ev.RankReplay, rank=st.just(1), steps=st.just((1,)), replay_ms=st.lists(ms, max_size=3).map(tuple)),
)
event = st.one_of(steps, steps, requests, requests, captures, others)


@st.composite
def streams(draw: st.DrawFn, max_size: int = 120) -> list[ev.Event]:
    """A stream in publishing order: its timestamps rise, one per event (as the engine's do)."""
    drawn = draw(st.lists(event, max_size=max_size))
    return [type(e)(**{**vars(e), "ts": 1_000.0 + i}) for i, e in enumerate(drawn)]
