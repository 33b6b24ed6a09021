"""``/metrics`` parses as Prometheus text, and what it counts is what the trace of the same run records:
the per-bucket hits and padding, passes by phase and mode, fallbacks by reason, capture costs, tokens and
finished requests (one event stream, two readers)."""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families
from support.serve_support import MODEL_NAME, TIMEOUT_S, engine_idle, serving, wait_until

from graphtop.engine.telemetry import events as ev
from graphtop.engine.trace_tools.summary import summarize
from graphtop.engine.trace_tools.trace import read_trace


def samples(text: str) -> dict[str, dict[tuple, float]]:
    """``{sample name: {sorted label items: value}}`` of an exposition."""
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


async def _traffic(url: str) -> None:
    """Prompts of several lengths (prefill graphs and padding fallbacks), five at once (decode bucket 8),
    one chat, one stream."""
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=TIMEOUT_S) as client:
        prompts = [
            "Hi",
            "The cat sat on the mat and looked around",
            "One two three four five six seven eight nine ten eleven twelve",
            "def f(x): return x",
            "Hello there",
        ]
        await asyncio.gather(
            *(
                client.completions.create(model=MODEL_NAME, prompt=p, max_tokens=6 + i, temperature=0)
                for i, p in enumerate(prompts)
            )
        )
        await client.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0
        )
        async for _ in await client.completions.create(
            model=MODEL_NAME, prompt="Stream", max_tokens=5, stream=True, extra_body={"ignore_eos": True}
        ):  # ignore_eos: a sampled end of text at its first token would give it no inter-token latency
            pass


def test_metrics_equal_the_counts_of_the_trace_of_the_same_run(demo_model, tmp_path) -> None:
    trace_path = tmp_path / "served.jsonl"
    with serving(demo_model, record=trace_path) as s:
        asyncio.run(_traffic(s.url))
        wait_until(lambda: engine_idle(s.engine), what="the engine to be idle")
        response = httpx.get(f"{s.url}/metrics", timeout=TIMEOUT_S)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    m = samples(response.text)
    trace = read_trace(str(trace_path))
    summary = summarize(trace)
    assert summary.requests_finished == 7 and m["graphtop:metrics_events_dropped"][()] == 0

    hits = {
        (("bucket", str(b)), ("phase", phase)): t.count
        for phase, ph in summary.phases.items()
        for b, t in ph.buckets.items()
    }
    padded = {
        (("bucket", str(b)), ("phase", phase)): t.padded_tokens
        for phase, ph in summary.phases.items()
        for b, t in ph.buckets.items()
    }
    assert m["graphtop:graph_bucket_hits_total"] == hits and sum(hits.values()) > 0
    assert m["graphtop:graph_bucket_padded_tokens_total"] == padded and sum(padded.values()) > 0
    passes = {}
    for phase, ph in summary.phases.items():
        for mode, count in (("graph", ph.graph_steps), ("eager", ph.eager_steps)):
            if count:
                passes[(("mode", mode), ("phase", phase))] = count
    assert m["graphtop:cuda_graph_passes_total"] == passes
    fallbacks = Counter()
    for labels, count in m["graphtop:eager_fallbacks_total"].items():
        fallbacks[dict(labels)["reason"]] += count
    assert dict(fallbacks) == dict(summary.fallbacks) and fallbacks  # short prompts pad too much: eager

    captured = {
        (("bucket", str(e.bucket)), ("phase", e.phase)): e.seconds
        for e in trace.events
        if isinstance(e, ev.CaptureProgress) and e.ok
    }
    assert m["graphtop:graph_capture_seconds"] == captured and len(captured) == 7  # decode 1,2,4,8 + 16,32,64
    assert set(m["graphtop:graph_capture_bytes"]) == set(captured)

    assert m["graphtop:prompt_tokens_total"][()] == summary.prompt_tokens
    assert m["graphtop:generation_tokens_total"][()] == summary.output_tokens
    assert m["graphtop:requests_finished_total"] == {
        (("finish_reason", r),): c for r, c in summary.finish_reasons.items()
    }
    assert m["graphtop:time_to_first_token_seconds_count"][()] == summary.ttft_ms.count == 7
    assert m["graphtop:e2e_request_latency_seconds_count"][()] == 7
    assert m["graphtop:inter_token_latency_seconds_count"][()] == 7  # every request made several tokens
    replay = sum(
        len(
            [
                e
                for e in trace.events
                if isinstance(e, ev.StepEvent) and e.path == "graph" and e.phase == phase and e.replay_ms is not None
            ]
        )
        for phase in summary.phases
    )
    assert sum(m["graphtop:graph_replay_seconds_count"].values()) == replay
    assert m["graphtop:num_requests_running"][()] == 0 and m["graphtop:kv_cache_usage_perc"][()] == 0
    assert m["graphtop:kv_cache_capacity_tokens"][()] == s.engine.kv_capacity_tokens
