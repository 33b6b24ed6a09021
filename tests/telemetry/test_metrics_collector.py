"""The Prometheus collector reads the event stream as the trace summary does: the same counts from the
same events, latencies from the request events, capture costs that a recapture replaces, and nothing
missed when a scrape follows a publish at once."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from graphtop.engine.telemetry import events as ev
from graphtop.engine.telemetry.bus import EventBus
from graphtop.engine.telemetry.metrics import MetricsCollector
from graphtop.engine.trace_tools.summary import summarize
from graphtop.tui.sessions.fake import boot_events, step_events


def scrape(collector: MetricsCollector) -> dict[str, dict[tuple, float]]:
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(collector.exposition().decode()):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def publish_all(events) -> tuple[dict, MetricsCollector]:
    bus = EventBus()
    collector = MetricsCollector(bus)
    for e in events:
        bus.publish(e)
    return scrape(collector), collector


def test_step_counts_equal_the_summary_of_the_same_events() -> None:
    events = boot_events() + step_events(300)
    m, collector = publish_all(events)
    summary = summarize(events)
    for phase, ph in summary.phases.items():
        for bucket, tally in ph.buckets.items():
            key = (("bucket", str(bucket)), ("phase", phase))
            assert m["graphtop:graph_bucket_hits_total"][key] == tally.count
            assert m["graphtop:graph_bucket_padded_tokens_total"][key] == tally.padded_tokens
        assert m["graphtop:cuda_graph_passes_total"].get((("mode", "graph"), ("phase", phase)), 0) == ph.graph_steps
        assert m["graphtop:cuda_graph_passes_total"].get((("mode", "eager"), ("phase", phase)), 0) == ph.eager_steps
    by_reason: dict[str, float] = {}
    for labels, count in m["graphtop:eager_fallbacks_total"].items():
        by_reason[dict(labels)["reason"]] = by_reason.get(dict(labels)["reason"], 0) + count
    assert by_reason == {("unspecified" if r == "(unspecified)" else r): c for r, c in summary.fallbacks}
    assert sum(len(ph.buckets) for ph in summary.phases.values()) > 1
    collector.close()


def test_request_latencies_and_tokens() -> None:
    m, collector = publish_all(
        [
            ev.RequestQueued(request_id="a", prompt_tokens=10, max_new_tokens=5),
            ev.RequestQueued(request_id="b", prompt_tokens=7, max_new_tokens=5),
            ev.RequestFirstToken(request_id="a", ttft_ms=100.0),
            ev.RequestFinished(request_id="a", output_tokens=5, finish_reason="length", latency_ms=300.0),
            ev.RequestFinished(request_id="c", output_tokens=0, finish_reason="rejected", error="too long"),
            ev.KVPoolState(capacity_tokens=200, used_tokens=50, running=1, queued=3, max_running=8),
        ]
    )
    assert m["graphtop:prompt_tokens_total"][()] == 17 and m["graphtop:generation_tokens_total"][()] == 5
    assert m["graphtop:requests_queued_total"][()] == 2
    assert m["graphtop:time_to_first_token_seconds_sum"][()] == 0.1
    assert m["graphtop:inter_token_latency_seconds_sum"][()] == 0.05  # (300 - 100) ms over 4 gaps
    assert m["graphtop:e2e_request_latency_seconds_count"][()] == 1  # the rejected one was never served
    assert m["graphtop:requests_finished_total"] == {
        (("finish_reason", "length"),): 1,
        (("finish_reason", "rejected"),): 1,
    }
    assert m["graphtop:kv_cache_usage_perc"][()] == 0.25 and m["graphtop:num_requests_waiting"][()] == 3
    assert m["graphtop:num_requests_running"][()] == 1
    collector.close()


def test_a_recapture_replaces_the_capture_costs_and_other_ranks_are_left_out() -> None:
    def captured(phase: str, buckets, rank: int = 0):
        yield ev.CaptureStarted(phase=phase, buckets=tuple(buckets), reason="recapture", rank=rank)
        for i, b in enumerate(buckets):
            yield ev.CaptureProgress(
                phase=phase,
                bucket=b,
                index=i + 1,
                total=len(buckets),
                seconds=0.5 * b,
                memory_bytes=1000 * b,
                rank=rank,
            )
        yield ev.CaptureFinished(phase=phase, captured=tuple(buckets), rank=rank)

    m, collector = publish_all(
        [
            *captured("decode", [1, 2, 4]),
            *captured("decode", [2, 8]),
            *captured("decode", [16], rank=1),
            ev.CaptureProgress(phase="prefill", bucket=64, ok=False, failure_reason="oom"),
            ev.RecaptureRequested(decode_bs=(2, 8)),
            ev.RecaptureRequested(decode_bs=(2, 8), cause="auto_tune", detail="decode −12.0 % step cost"),
            ev.RecaptureFinished(ok=True),
            ev.RecaptureFinished(ok=False),
        ]
    )
    assert m["graphtop:graph_capture_seconds"] == {
        (("bucket", "2"), ("phase", "decode")): 1.0,
        (("bucket", "8"), ("phase", "decode")): 4.0,
    }
    assert m["graphtop:graph_capture_bytes"][(("bucket", "8"), ("phase", "decode"))] == 8000
    assert m["graphtop:graphs_captured"][(("phase", "decode"),)] == 2
    assert m["graphtop:graph_capture_failures_total"][(("phase", "prefill"),)] == 1
    assert m["graphtop:recaptures_total"] == {(("result", "ok"),): 1, (("result", "failed"),): 1}
    assert m["graphtop:recapture_requests_total"] == {(("cause", "manual"),): 1, (("cause", "auto_tune"),): 1}
    collector.close()


def test_parity_errors_and_the_engine_info() -> None:
    m, collector = publish_all(
        [
            ev.EngineStarted(
                model="m", device="cpu", dtype="float32", decode_graph_backend="full", prefill_graph_backend="breakable"
            ),
            ev.ParityCheck(phase="decode", mismatch=False),
            ev.ParityCheck(phase="decode", mismatch=True),
            ev.ErrorEvent(message="x", where="step"),
        ]
    )
    assert m["graphtop:parity_checks_total"][(("phase", "decode"),)] == 2
    assert m["graphtop:parity_mismatches_total"][(("phase", "decode"),)] == 1
    assert m["graphtop:errors_total"][(("where", "step"),)] == 1
    ((labels, value),) = m["graphtop:engine_info"].items()
    assert dict(labels)["device"] == "cpu" and value == 1
    collector.close()


def test_a_scrape_right_after_a_publish_counts_it_and_a_full_queue_is_shown() -> None:
    bus = EventBus()
    collector = MetricsCollector(bus, maxsize=1)
    for i in range(200):  # the collector's thread keeps up, or loses some: either way the gauge says
        bus.publish(ev.RequestQueued(request_id=f"r{i}", prompt_tokens=1))
    m = scrape(collector)
    assert m["graphtop:requests_queued_total"][()] + m["graphtop:metrics_events_dropped"][()] == 200
    collector.close()
    assert not any(s.name == "metrics" for s in bus.subscriptions)
