"""The one fold of the event stream: folding is the same whatever the batches, what it retains rebuilds
what it knows (the state keeper's promise to a late viewer), and the readers that are views over it
(the dashboard, the trace summary, the metrics) agree on the same stream."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

from hypothesis import example, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from support.event_streams import streams

from graphtop.engine.telemetry import events as ev
from graphtop.engine.telemetry.bus import EventBus
from graphtop.engine.telemetry.fold import RECENT_REFUSALS, REFUSAL_WHERE, FoldLimits, RunFold
from graphtop.engine.telemetry.metrics import MetricsCollector
from graphtop.engine.trace_tools.summary import UNSPECIFIED, summarize
from graphtop.tui.state import DashboardState


def facts(fold: RunFold) -> dict:
    """What a fold knows, as comparable values."""
    return {
        "seq": fold.seq,
        "counts": dict(fold.counts),
        "hits": fold.steps.hits,
        "phases": fold.steps.phases,
        "in_use": fold.steps.in_use,
        "fallbacks": dict(fold.steps.fallbacks),
        "requests": (
            fold.requests.queued,
            fold.requests.finished,
            dict(fold.requests.reasons),
            list(fold.requests.open),
        ),
        "ttft": list(fold.requests.ttft_ms.values),
        "captures": {p: (c.planned, c.captured, c.failed) for p, c in fold.captures.latest.items()},
        "costs": fold.costs,
        "parity": fold.parity,
        "retained": fold.retained(),
    }


@settings(max_examples=60, deadline=None)
@given(streams(), st.lists(st.integers(1, 12), min_size=1, max_size=8))
def test_folding_in_batches_equals_folding_at_once(stream, sizes) -> None:
    """A subscriber folds what it drained, batch by batch (the endpoint, the metrics' thread)."""
    whole = RunFold()
    whole.apply_all(stream)
    batched = RunFold()
    at = 0
    for size in itertools.cycle(sizes):
        if at >= len(stream):
            break
        batched.apply_all(stream[at : at + size])
        at += size
    assert facts(batched) == facts(whole)


@settings(max_examples=80, deadline=None)
@given(streams(max_size=200))
@example(  # an id queued again while open is the newest open request, as it is when rebuilt
    [
        ev.RequestQueued(ts=1000.0 + i, request_id=rid, prompt_tokens=0, max_new_tokens=0)
        for i, rid in enumerate(["r1", "r0", "r1"])
    ]
)
def test_what_the_fold_retains_rebuilds_what_it_knows_of_the_engine(stream) -> None:
    """The state keeper's snapshot: a fold fed only the retained events knows the engine as one fed it all."""
    limits = FoldLimits(steps=16, alerts=4)
    full = RunFold(limits)
    full.apply_all(stream)
    late = RunFold(limits)
    late.apply_all(full.retained())
    assert (late.info, late.ledgers, late.kv, late.load_progress) == (
        full.info,
        full.ledgers,
        full.kv,
        full.load_progress,
    )
    assert (late.recapture_pending, late.last_recapture) == (full.recapture_pending, full.last_recapture)
    assert {k: (c.planned, c.captured, c.failed) for k, c in late.captures.latest.items()} == {
        k: (c.planned, c.captured, c.failed) for k, c in full.captures.latest.items()
    }
    assert list(late.steps.recent) == list(full.steps.recent)
    assert list(late.downgrades) == list(full.downgrades) and late.all_errors() == full.all_errors()
    open_ = [rid for rid, r in full.requests.open.items() if r.events]
    assert [rid for rid, r in late.requests.open.items() if r.events] == open_
    assert late.retained() == full.retained()  # what it retains is a fixed point
    assert [e.ts for e in full.retained()] == sorted(e.ts for e in full.retained())  # in stream order


def scrape(collector: MetricsCollector) -> defaultdict[str, dict[tuple, float]]:
    out: defaultdict[str, dict[tuple, float]] = defaultdict(dict)
    for family in text_string_to_metric_families(collector.exposition().decode()):
        for s in family.samples:
            out[s.name][tuple(sorted(s.labels.items()))] = s.value
    return out


@settings(max_examples=40, deadline=None)
@given(streams(max_size=150))
def test_the_dashboard_the_summary_and_the_metrics_agree_on_a_stream(stream) -> None:
    summary = summarize(stream)
    state = DashboardState()
    state.apply_all(stream)
    collector = MetricsCollector(EventBus())
    try:
        for e in stream:
            collector.apply(e)
        m = scrape(collector)
    finally:
        collector.close()
    passes = m["graphtop:cuda_graph_passes_total"]
    assert summary.steps == state.total_steps == sum(passes.values())
    assert summary.graph_steps == state.graph_steps
    for phase, ph in summary.phases.items():
        assert passes.get((("mode", "graph"), ("phase", phase)), 0) == ph.graph_steps
        assert passes.get((("mode", "eager"), ("phase", phase)), 0) == ph.eager_steps
        for bucket, tally in ph.buckets.items():
            key = (("bucket", str(bucket)), ("phase", phase))
            assert m["graphtop:graph_bucket_hits_total"][key] == tally.count
            assert m["graphtop:graph_bucket_padded_tokens_total"][key] == tally.padded_tokens
    by_reason: dict[str, float] = {}
    for labels, n in m["graphtop:eager_fallbacks_total"].items():
        by_reason[dict(labels)["reason"]] = by_reason.get(dict(labels)["reason"], 0) + n
    assert (
        by_reason
        == dict(state.fallbacks)
        == {(r if r != UNSPECIFIED else "unspecified"): n for r, n in summary.fallbacks}
    )
    finished = m["graphtop:requests_finished_total"]
    assert summary.requests_finished == state.requests_finished == sum(finished.values())
    assert summary.requests_queued == state.requests_queued == m["graphtop:requests_queued_total"].get((), 0)
    assert summary.ttft_ms.count == m["graphtop:time_to_first_token_seconds_count"].get((), 0) == len(state.ttft_ms)
    assert summary.parity.checks == state.parity.checks == sum(m["graphtop:parity_checks_total"].values())


def test_a_finished_request_gives_its_inter_token_latency_and_a_rejected_one_none() -> None:
    fold = RunFold()
    done = []
    fold.requests.on_finish.append(done.append)
    fold.apply_all(
        [
            ev.RequestQueued(request_id="a", prompt_tokens=3),
            ev.RequestFirstToken(request_id="a", ttft_ms=100.0),
            ev.RequestFinished(request_id="a", output_tokens=5, finish_reason="length", latency_ms=300.0),
            ev.RequestFirstToken(request_id="b", ttft_ms=10.0),  # queued before the stream began
            ev.RequestFinished(request_id="b", output_tokens=3, finish_reason="eos", latency_ms=30.0),
            ev.RequestFinished(request_id="c", finish_reason="rejected", latency_ms=1.0),
        ]
    )
    assert [(d.request_id, d.itl_ms, d.served) for d in done] == [
        ("a", 50.0, True),
        ("b", 10.0, True),
        ("c", None, False),
    ]
    assert list(fold.requests.itl_ms.values) == [50.0, 10.0] and not fold.requests.open
    assert fold.retained() == []  # nothing open, nothing of the engine seen


def test_open_requests_are_bounded_the_oldest_forgotten_first() -> None:
    fold = RunFold(FoldLimits(open_requests=3))
    fold.apply_all(ev.RequestQueued(request_id=f"r{i}") for i in range(10))
    assert list(fold.requests.open) == ["r7", "r8", "r9"] and fold.requests.queued == 10


def test_refusals_are_kept_apart_so_they_never_push_out_the_engines_errors() -> None:
    fold = RunFold(FoldLimits(alerts=3))
    fold.apply(ev.ErrorEvent(message="real", where="decode"))
    fold.apply_all(ev.ErrorEvent(message=f"junk {i}", where=REFUSAL_WHERE) for i in range(50))
    assert [e.message for e in fold.errors] == ["real"] and len(fold.refusals) == RECENT_REFUSALS
    assert fold.errors_by_where == {"decode": 1, REFUSAL_WHERE: 50}


def test_a_capture_pass_restarts_the_hits_on_the_graphs_in_use_of_its_bucket_list_only() -> None:
    fold = RunFold()
    for phase in ("decode", "prefill", "mixed"):
        fold.apply(ev.StepEvent(phase=phase, path="graph", bucket=8, padded=1))
    assert set(fold.steps.in_use) == {("decode", 8), ("prefill", 8)}  # mixed steps use prefill's list
    fold.apply(ev.CaptureStarted(phase="prefill", buckets=(8,)))
    assert set(fold.steps.in_use) == {("decode", 8)}
    assert {p: t.buckets[8].count for p, t in fold.steps.phases.items()} == {"decode": 1, "prefill": 1, "mixed": 1}


def test_a_timing_that_is_no_measurement_is_counted_as_a_step_but_never_sampled() -> None:
    fold = RunFold()
    fold.apply(ev.StepEvent(phase="decode", path="graph", bucket=1, replay_ms=math.nan, host_ms=-1.0))
    fold.apply(ev.RequestFirstToken(request_id="a", ttft_ms=math.inf))
    assert fold.steps.hits.graph_steps == 1 and not fold.steps.replay_ms.values and not fold.requests.ttft_ms.values
    assert list(fold.steps.host_by_phase.values("decode")) == [0.0]
