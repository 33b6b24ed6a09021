"""Exports a trace as Chrome trace-event JSON, which ui.perfetto.dev and chrome://tracing open.

Layout (one process, "graphtop engine"):

* track "graph steps" / "eager steps": one complete slice (``ph: "X"``) per step, named
  ``"<phase> bs=<batch_size>"``; args carry bucket, padding, fallback reason and both timings;
* track "capture": one slice per capture pass (capture_started .. capture_finished);
  track "capture buckets": one slice per bucket, its length the bucket's capture seconds;
* counters (``ph: "C"``): "kv" (used_tokens, free_tokens), "requests" (running, queued),
  "padding" (waste, per graph step) and "memory" (the ledger's parts, bytes). Perfetto names each
  counter track "<name> <arg>", e.g. "kv used_tokens";
* requests: async slices (``ph: "b"``/``"e"``, id = request_id) from queued to finished (closed at
  the trace end if unfinished), plus a sibling "ttft" async slice from queued to first token;
* instants (``ph: "i"``): errors, config downgrades, recaptures.

Timing assumption: an event's ``ts`` is taken when the engine emits it, i.e. at the *end* of the
step or capture, so a slice spans ``[ts - dur, ts]``. Slices on one track are clamped so they
never overlap (Perfetto mis-nests overlapping complete events); the unclamped timings stay in args.
Timestamps are microseconds relative to the earliest ``ts`` in the trace (``otherData.t0_unix_s``).

The export writes one thing per event, so it walks the events itself; what it needs to know of the
stream so far (the requests still open and when they were queued, the capture pass each phase has
open) it reads off a ``RunFold`` it folds alongside, the fold the summary and the dashboard read.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Optional, Union

from ..telemetry.events import (
    CaptureFinished,
    CaptureProgress,
    CaptureStarted,
    ConfigDowngrade,
    ErrorEvent,
    Event,
    KVPoolState,
    MemoryLedger,
    RecaptureFinished,
    RecaptureRequested,
    RequestFinished,
    RequestFirstToken,
    RequestQueued,
    StepEvent,
)
from ..telemetry.fold import FoldLimits, RunFold
from ..telemetry.safe_write import write_atomic
from .trace import Trace

__all__ = ["export_perfetto", "write_perfetto", "PID", "TID_GRAPH", "TID_EAGER", "TID_CAPTURE"]

PID = 1
TID_GRAPH = 1
TID_EAGER = 2
TID_CAPTURE = 3
TID_CAPTURE_BUCKETS = 4
TID_EVENTS = 5
_TRACK_NAMES = {
    TID_GRAPH: "graph steps",
    TID_EAGER: "eager steps",
    TID_CAPTURE: "capture",
    TID_CAPTURE_BUCKETS: "capture buckets",
    TID_EVENTS: "engine events",
}


def _clean(v: Any) -> Any:
    """JSON-safe value: non-finite floats become None (strict JSON parsers reject NaN)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    return v


_PER_RANK = (CaptureStarted, CaptureProgress, CaptureFinished, MemoryLedger)


class _Exporter:
    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        # Origin: the header, or an earlier event (ts is taken at event creation, which can precede
        # the recorder's header), so no timestamp is negative.
        self.t0 = min([trace.header.ts] + [e.ts for e in trace.events])
        self.out: list[dict[str, Any]] = []
        self.track_end: dict[int, float] = {}  # tid -> end (µs) of the last slice on that track
        # the stream before the event being written: open requests, open capture passes
        self.fold = RunFold(FoldLimits(steps=0, samples=0, alerts=0, captures=1, open_requests=sys.maxsize))

    def us(self, ts: float) -> float:
        return round((ts - self.t0) * 1e6, 3)

    def slice(self, tid: int, name: str, end_ts: float, dur_ms: float, cat: str, args: dict) -> None:
        end = self.us(end_ts)
        dur = max(0.0, dur_ms * 1000.0) if math.isfinite(dur_ms) else 0.0
        start = max(end - dur, self.track_end.get(tid, -math.inf))
        if start > end:  # out-of-order timestamps: keep the slice, zero length, at the track end
            end = start
        self.track_end[tid] = end
        self.out.append(
            {
                "name": name,
                "cat": cat,
                "ph": "X",
                "pid": PID,
                "tid": tid,
                "ts": round(start, 3),
                "dur": round(end - start, 3),
                "args": _clean(args),
            }
        )

    def counter(self, name: str, ts: float, values: dict[str, Any]) -> None:
        self.out.append({"name": name, "ph": "C", "pid": PID, "ts": self.us(ts), "args": _clean(values)})

    def instant(self, name: str, ts: float, cat: str, args: dict) -> None:
        self.out.append(
            {
                "name": name,
                "cat": cat,
                "ph": "i",
                "s": "p",
                "pid": PID,
                "tid": TID_EVENTS,
                "ts": self.us(ts),
                "args": _clean(args),
            }
        )

    def queued_at(self, request_id: str) -> Optional[float]:
        """When an open request was queued (µs); None if its queueing is not in the trace."""
        req = self.fold.requests.open.get(request_id)
        return self.us(req.events[0][1].ts) if req is not None and req.events else None

    def capture_open(self, phase: str) -> Optional[float]:
        """When rank 0's open capture pass of ``phase`` started (µs); None if none is open."""
        events = self.fold.capture_events.get((0, phase))
        if not events or not isinstance(events[0][1], CaptureStarted) or isinstance(events[-1][1], CaptureFinished):
            return None
        return self.us(events[0][1].ts)

    def metadata(self) -> list[dict[str, Any]]:
        meta: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": PID, "args": {"name": "graphtop engine"}},
        ]
        for tid, name in _TRACK_NAMES.items():
            meta.append({"name": "thread_name", "ph": "M", "pid": PID, "tid": tid, "args": {"name": name}})
            meta.append({"name": "thread_sort_index", "ph": "M", "pid": PID, "tid": tid, "args": {"sort_index": tid}})
        return meta

    def run(self) -> dict[str, Any]:
        for ev in self.trace.events:
            self.write(ev)
            self.fold.apply(ev)
        self.close_unfinished_requests()
        return {
            "traceEvents": self.metadata() + self.out,
            "displayTimeUnit": "ms",
            "otherData": _clean(
                {
                    "graphtop_trace": self.trace.path,
                    "schema_version": self.trace.header.schema_version,
                    "t0_unix_s": self.t0,
                    "truncated_tail": self.trace.truncated_tail,
                    "meta": self.trace.header.meta,
                }
            ),
        }

    def write(self, ev: Event) -> None:
        """What ``ev`` adds to the timeline (the fold holds the stream before it)."""
        if isinstance(ev, _PER_RANK) and ev.rank:
            return  # the tracks show rank 0 (a worker's capture passes would overlap its slices)
        if isinstance(ev, StepEvent):
            self.step(ev)
        elif isinstance(ev, KVPoolState):
            free = max(0, ev.capacity_tokens - ev.used_tokens)
            self.counter("kv", ev.ts, {"used_tokens": ev.used_tokens, "free_tokens": free})
            self.counter("requests", ev.ts, {"running": ev.running, "queued": ev.queued})
        elif isinstance(ev, CaptureProgress):
            name = f"capture {ev.phase} {ev.bucket}" + ("" if ev.ok else " FAILED")
            args = {
                "phase": ev.phase,
                "bucket": ev.bucket,
                "index": ev.index,
                "total": ev.total,
                "seconds": ev.seconds,
                "memory_bytes": ev.memory_bytes,
                "ok": ev.ok,
                "failure_reason": ev.failure_reason,
            }
            self.slice(TID_CAPTURE_BUCKETS, name, ev.ts, ev.seconds * 1000.0, "capture", args)
        elif isinstance(ev, CaptureFinished):
            start = self.capture_open(ev.phase)
            end = self.us(ev.ts)
            dur_ms = (end - start) / 1000.0 if start is not None else ev.seconds * 1000.0
            args = {
                "captured": ev.captured,
                "failed": ev.failed,
                "seconds": ev.seconds,
                "memory_bytes": ev.memory_bytes,
                "ok": ev.ok,
                "failure_reason": ev.failure_reason,
            }
            self.slice(TID_CAPTURE, f"capture {ev.phase}", ev.ts, dur_ms, "capture", args)
        elif isinstance(ev, MemoryLedger):
            self.counter(
                "memory",
                ev.ts,
                {
                    "weights": ev.weights,
                    "kv_pool": ev.kv_pool,
                    "decode_graphs": ev.decode_graphs,
                    "prefill_graphs": ev.prefill_graphs,
                    "activation_reserve": ev.activation_reserve,
                    "free": ev.free,
                },
            )
        elif isinstance(ev, RequestQueued):
            self.request_begin(ev)
        elif isinstance(ev, RequestFirstToken):
            self.request_first_token(ev)
        elif isinstance(ev, RequestFinished):
            self.request_end(ev)
        elif isinstance(ev, ErrorEvent):
            self.instant(f"error: {ev.message}", ev.ts, "error", ev.to_dict())
        elif isinstance(ev, ConfigDowngrade):
            self.instant(f"downgrade {ev.key}", ev.ts, "config", ev.to_dict())
        elif isinstance(ev, (RecaptureRequested, RecaptureFinished)):
            self.instant(ev.type, ev.ts, "capture", ev.to_dict())

    def step(self, ev: StepEvent) -> None:
        graph = ev.path == "graph"
        dur_ms = ev.replay_ms if graph and ev.replay_ms is not None else ev.host_ms
        args = {
            "step": ev.step,
            "phase": ev.phase,
            "batch_size": ev.batch_size,
            "num_tokens": ev.num_tokens,
            "bucket": ev.bucket,
            "padded": ev.padded,
            "padding_waste": ev.padding_waste,
            "fallback_reason": ev.fallback_reason,
            "host_ms": ev.host_ms,
            "replay_ms": ev.replay_ms,
            "segment_ms": ev.segment_ms,
            "break_ms": ev.break_ms,
            "emulated": ev.emulated,
        }
        tid = TID_GRAPH if graph else TID_EAGER
        self.slice(tid, f"{ev.phase} bs={ev.batch_size}", ev.ts, dur_ms, "step", args)
        if graph and ev.bucket is not None:
            self.counter("padding", ev.ts, {"waste": ev.padding_waste})

    def close_unfinished_requests(self) -> None:
        """End requests still open when the trace stops (killed run) at the last timestamp."""
        queued = {rid: at for rid in self.fold.requests.open if (at := self.queued_at(rid)) is not None}
        if not queued:
            return
        last = max([self.us(e.ts) for e in self.trace.events[-1:]] + list(queued.values()))
        for rid, start in queued.items():
            self.out.append(
                {
                    "name": f"request {rid}",
                    "cat": "request",
                    "ph": "e",
                    "id": rid,
                    "pid": PID,
                    "ts": max(start, last),
                    "args": {"unfinished": True},
                }
            )

    def request_begin(self, ev: RequestQueued) -> None:
        ts = self.us(ev.ts)
        self.out.append(
            {
                "name": f"request {ev.request_id}",
                "cat": "request",
                "ph": "b",
                "id": ev.request_id,
                "pid": PID,
                "ts": ts,
                "args": {"prompt_tokens": ev.prompt_tokens, "max_new_tokens": ev.max_new_tokens},
            }
        )

    def request_first_token(self, ev: RequestFirstToken) -> None:
        start = self.queued_at(ev.request_id)
        if start is None:  # queued before the trace began: nothing to nest in
            return
        end = self.us(ev.ts)
        # Own async id (not nested in the request's): equal start timestamps make nesting order
        # ambiguous for the importer, a sibling slice is unambiguous.
        common = {
            "name": f"ttft {ev.request_id}",
            "cat": "request",
            "id": f"{ev.request_id}/ttft",
            "pid": PID,
        }
        self.out.append({**common, "ph": "b", "ts": start, "args": {"ttft_ms": _clean(ev.ttft_ms)}})
        self.out.append({**common, "ph": "e", "ts": max(start, end)})

    def request_end(self, ev: RequestFinished) -> None:
        start = self.queued_at(ev.request_id)
        if start is None:
            return
        self.out.append(
            {
                "name": f"request {ev.request_id}",
                "cat": "request",
                "ph": "e",
                "id": ev.request_id,
                "pid": PID,
                "ts": max(start, self.us(ev.ts)),
                "args": _clean(
                    {
                        "output_tokens": ev.output_tokens,
                        "finish_reason": ev.finish_reason,
                        "latency_ms": ev.latency_ms,
                        "error": ev.error,
                    }
                ),
            }
        )


def export_perfetto(trace: Trace) -> dict[str, Any]:
    """Chrome trace-event JSON object (``{"traceEvents": [...], "displayTimeUnit": "ms"}``)."""
    return _Exporter(trace).run()


def write_perfetto(trace: Trace, out_path: Union[str, "os.PathLike[str]"], label: str = "OUT") -> Path:
    """Write ``export_perfetto(trace)`` to ``out_path`` (strict JSON: no NaN); return the path.

    The JSON is built completely before anything is written, then goes through ``write_atomic``
    (temporary file + rename): OUT is a whole, valid export or is left as it was.
    """
    out = Path(out_path)
    data = json.dumps(export_perfetto(trace), separators=(",", ":"), allow_nan=False).encode("utf-8")
    write_atomic(out, lambda f: f.write(data), label)
    return out
