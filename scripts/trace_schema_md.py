"""Writes docs/trace-schema.md from graphtop.engine.telemetry.events: the schema page is generated from the
event classes, so it cannot drift from them. ``--check`` exits 1 when the page is stale (a test runs it)."""

import argparse
import dataclasses
import json
import sys
import typing
from pathlib import Path

from graphtop.engine.telemetry import events as ev

TS = 1767225600.123456  # fixed example timestamp (2026-01-01T00:00:00.123456Z)

DESCRIPTIONS = {
    "ts": "wall-clock seconds since the Unix epoch (`time.time()`) when the engine emitted the event; for steps and captures that is when the work *finished*",
    "header.schema_version": "version of this schema (from 1); readers refuse traces newer than they know, and 0 or below",
    "header.graphtop_version": "graphtop package version that wrote the trace",
    "header.meta": "free-form run metadata from the CLI (argv, model path, config, synthetic workload, ...)",
    "load_progress.label": "what the load does, e.g. `converting GGUF to the cache (one time)`",
    "load_progress.step": "where it is: `reading the metadata`, `reading the tokenizer`, `tensor`, `checking the weights`, `writing the converted folder`",
    "load_progress.done": "items of the step done (for `tensor`: tensors dequantized)",
    "load_progress.total": "items of the step; 0 for a step of unknown length",
    "engine_started.model": "model name or path",
    "engine_started.architecture": "model architecture (e.g. `LlamaForCausalLM`)",
    "engine_started.device": "torch device string (`cuda:0`, `cpu`)",
    "engine_started.device_name": "human device name (e.g. `NVIDIA H200`)",
    "engine_started.dtype": "model dtype (`bfloat16`, ...)",
    "engine_started.attention_backend": "attention backend in use (e.g. `torch`)",
    "engine_started.attention_backend_note": "why that backend was chosen (fallback explanation), may be empty",
    "engine_started.decode_graph_backend": "label of the decode graph backend (e.g. `full`)",
    "engine_started.prefill_graph_backend": "label of the prefill graph backend (e.g. `breakable`)",
    "engine_started.emulated": "true when graphs are emulated (no real CUDA graphs, e.g. on CPU): timings are not real replay timings",
    "engine_started.graph_config": "effective graph configuration (buckets, limits, ...)",
    "engine_started.locked_keys": "graph-config keys the user set explicitly; these are never downgraded automatically",
    "engine_started.demo": "true for the built-in demo run",
    "engine_started.tp_size": "tensor-parallel ranks serving the model (1: no tensor parallelism)",
    "capture_started.phase": "`decode` or `prefill`",
    "capture_started.buckets": "buckets about to be captured (decode: batch sizes; prefill: token counts)",
    "capture_started.backend": "graph backend doing the capture",
    "capture_started.reason": "`initial` or `recapture`",
    "capture_started.rank": "tensor-parallel rank that captures (0: the engine's own process; every rank captures the same buckets in its own pool)",
    "capture_progress.phase": "`decode` or `prefill`",
    "capture_progress.bucket": "the bucket this event reports",
    "capture_progress.index": "1-based position of the bucket in this capture pass",
    "capture_progress.total": "number of buckets in this capture pass",
    "capture_progress.seconds": "seconds this bucket's capture took",
    "capture_progress.memory_bytes": "device-memory delta of this capture, bytes",
    "capture_progress.ok": "false when this bucket failed to capture",
    "capture_progress.failure_reason": "why it failed (null when ok)",
    "capture_progress.rank": "tensor-parallel rank that captured it (a bucket that fails on one rank runs eagerly on all)",
    "capture_finished.phase": "`decode` or `prefill`",
    "capture_finished.captured": "buckets captured successfully",
    "capture_finished.failed": "buckets that failed",
    "capture_finished.seconds": "total seconds of this capture pass",
    "capture_finished.memory_bytes": "total device memory held by this pass's graphs, bytes",
    "capture_finished.ok": "false when the pass as a whole failed",
    "capture_finished.failure_reason": "why the pass failed (null when ok)",
    "capture_finished.rank": "tensor-parallel rank of this pass",
    "step.forward_ms": "GPU milliseconds of an eager step's forward on CUDA (CUDA events; null elsewhere)",
    "step.launch_ms": "host milliseconds from the step's start (a capture slice before it included) to its "
    "forward launched, without waiting for the device; equals `host_ms` for a step launched under the overlap "
    "schedule. What the GPU waited on the host for: `host_ms` of a step sampled at once also holds its device time",
    "capture_finished.kernels_compiled": "Triton kernel variants of this pass that worker processes compiled "
    "before capture (0 where kernels compile during capture)",
    "capture_finished.kernels_cached": "Triton kernel variants of this pass loaded from the cache folder",
    "memory_ledger.device": "device the ledger describes (`cuda:0`; host memory on CPU)",
    "memory_ledger.total": "total memory, bytes",
    "memory_ledger.weights": "model weights, bytes",
    "memory_ledger.kv_pool": "KV-cache pool, bytes",
    "memory_ledger.decode_graphs": "captured decode graphs (their private pools), bytes",
    "memory_ledger.prefill_graphs": "captured prefill graphs, bytes",
    "memory_ledger.activation_reserve": "memory kept free for eager activations, bytes",
    "memory_ledger.free": "free memory left, bytes",
    "memory_ledger.rank": "tensor-parallel rank whose device this ledger describes",
    "memory_ledger.experts": "of `weights`, a mixture of experts' expert weights (this rank's share), bytes; 0 for a dense model",
    "kv_pool.capacity_tokens": "KV pool capacity, tokens",
    "kv_pool.used_tokens": "tokens currently held in the KV pool",
    "kv_pool.page_size": "tokens per KV page",
    "kv_pool.running": "requests currently running",
    "kv_pool.queued": "requests waiting for admission",
    "kv_pool.max_running": "limit on running requests",
    "step.step": "step counter, increments by 1 per forward step (gaps in a trace mean dropped events)",
    "step.phase": "`decode`, `prefill` or `mixed`",
    "step.batch_size": "sequences in the step",
    "step.num_tokens": "real (unpadded) tokens in the step",
    "step.bucket": "graph bucket used (decode: batch size; prefill: token count); null when none",
    "step.padded": "padding tokens/slots added to reach the bucket",
    "step.padding_waste": "padded / (real + padded), i.e. the wasted fraction of the bucket, 0..1",
    "step.path": "`graph` (replayed a captured graph) or `eager`",
    "step.fallback_reason": "why an eager step did not use a graph (e.g. `exceeds_max_bucket`, `phase_disabled`); null on graph steps",
    "step.host_ms": "host wall time of the step's forward and sampling, milliseconds; for a decode step launched under the overlap schedule (before the previous step was read back), the host time to prepare and launch it, its GPU time being `replay_ms`",
    "step.replay_ms": "graph replay time, milliseconds (graph steps; null otherwise or if not measured)",
    "step.segment_ms": "breakable prefill graphs: time in graphed segments, milliseconds",
    "step.break_ms": "breakable prefill graphs: time in eager breaks (attention), milliseconds",
    "step.emulated": "true when the graph path was emulated",
    "rank_replay.rank": "the worker rank (1 and up; rank 0's replay times are in `step` events)",
    "rank_replay.steps": "forward steps replayed from a graph since the rank's previous `rank_replay` (they number like `step.step`)",
    "rank_replay.replay_ms": "the rank's replay time of each of those steps, milliseconds",
    "parity_check.step": "the step (`step.step`) that was checked",
    "parity_check.phase": "`decode` or `prefill` (prefill through breakable graphs)",
    "parity_check.batch_size": "sequences in the step",
    "parity_check.num_tokens": "real tokens in the step",
    "parity_check.bucket": "the graph bucket the step replayed",
    "parity_check.rows": "logit rows compared: the step's sampled rows whose requests still held their KV when the check finished",
    "parity_check.max_abs_err": "largest absolute difference between the graph's and the eager re-run's logits",
    "parity_check.max_rel_err": "largest per-row max absolute difference over that row's largest eager logit magnitude",
    "parity_check.argmax_agree": "fraction of rows whose argmax (greedy token) agrees, 0..1",
    "parity_check.top5_overlap": "mean fraction of the eager top-5 tokens also in the graph's top 5, 0..1",
    "parity_check.tolerance": "relative error above which the check is a mismatch (by dtype, or `EngineConfig.parity_tolerance`)",
    "parity_check.mismatch": "true when `max_rel_err` exceeds `tolerance`: the graph computed something the eager path does not",
    "parity_check.check_ms": "wall time of the check (snapshot to comparison), milliseconds; it runs off the step loop",
    "parity_check.every": "one graph step in this many is checked (`--parity-every`)",
    "parity_check.skipped": "checks due but not run so far (the previous one still running, or a step larger than the scratch KV), cumulative",
    "parity_check.discarded": "checks dropped as inconclusive so far (every request's KV was freed while its check ran), cumulative",
    "parity_not_run.step": "the step (`step.step`) the check was for, when it had been numbered (a discarded check's); null for a skipped step",
    "parity_not_run.reason": "`discarded` (every request's KV was freed while the check ran: inconclusive), `too_large` (the step needs more scratch KV pages than are reserved), `capture_pending` (a recapture waits for the step loop)",
    "parity_not_run.skipped": "checks due but not run so far, cumulative (as in `parity_check`)",
    "parity_not_run.discarded": "checks dropped as inconclusive so far, cumulative (as in `parity_check`)",
    "parity_not_run.every": "one graph step in this many is checked (`--parity-every`)",
    "request_queued.request_id": "request id",
    "request_queued.prompt_tokens": "prompt length, tokens",
    "request_queued.max_new_tokens": "generation limit, tokens",
    "request_first_token.request_id": "request id",
    "request_first_token.ttft_ms": "time from queued to first output token, milliseconds",
    "request_first_token.queue_ms": (
        "of `ttft_ms`, the time the request waited in the queue before the scheduler first admitted it, milliseconds"
    ),
    "request_finished.request_id": "request id",
    "request_finished.output_tokens": "tokens generated",
    "request_finished.finish_reason": "`eos`, `length`, `stop` (stop string), `rejected`, `cancelled`",
    "request_finished.latency_ms": "time from queued to finished, milliseconds",
    "request_finished.error": "error message when the request failed, else null",
    "recapture_requested.decode_bs": "new decode buckets requested (null: unchanged)",
    "recapture_requested.prefill_num_tokens": "new prefill buckets requested (null: unchanged)",
    "recapture_requested.cause": "who asked: `manual` (the bucket editor, the Python API) or `auto_tune`",
    "recapture_requested.detail": "why, in words: for `auto_tune` the held-out step cost saved and the graph "
    "memory added",
    "recapture_finished.ok": "whether the recapture succeeded",
    "recapture_finished.decode_bs": "decode buckets now captured",
    "recapture_finished.prefill_num_tokens": "prefill buckets now captured",
    "recapture_finished.seconds": "seconds the recapture took",
    "recapture_finished.memory_freed_bytes": "memory released from the old graphs, bytes",
    "recapture_finished.memory_bytes": "memory held by the new graphs, bytes",
    "recapture_finished.message": "human-readable outcome",
    "config_downgrade.key": "graph-config key that was changed",
    "config_downgrade.old": "previous value (any JSON value)",
    "config_downgrade.new": "new value (any JSON value)",
    "config_downgrade.reason": "why it was changed",
    "error.message": "error message",
    "error.where": "component that raised it",
    "error.fatal": "true when the engine stops because of it",
    "error.rank": "tensor-parallel rank the error concerns (e.g. the one that died); null when none",
}

EXAMPLES = {
    "load_progress": dict(label="converting GGUF to the cache (one time)", step="tensor", done=12, total=272),
    "header": dict(meta={"argv": ["graphtop", "run", "--record", "run.jsonl"], "model": "Qwen/Qwen2.5-0.5B"}),
    "engine_started": dict(
        model="Qwen/Qwen2.5-0.5B",
        architecture="Qwen2ForCausalLM",
        device="cuda:0",
        device_name="NVIDIA H200",
        dtype="bfloat16",
        attention_backend="torch",
        decode_graph_backend="full",
        prefill_graph_backend="breakable",
        graph_config={"decode_bs": [1, 2, 4, 8]},
        locked_keys=("decode_bs",),
    ),
    "capture_started": dict(phase="decode", buckets=(1, 2, 4, 8), backend="full"),
    "capture_progress": dict(phase="decode", bucket=4, index=3, total=4, seconds=0.21, memory_bytes=8388608),
    "capture_finished": dict(phase="decode", captured=(1, 2, 4), failed=(8,), seconds=0.93, memory_bytes=25165824),
    "memory_ledger": dict(
        device="cuda:0",
        total=150011428864,
        weights=988807168,
        kv_pool=8589934592,
        decode_graphs=25165824,
        prefill_graphs=0,
        activation_reserve=2147483648,
        free=138259972096,
    ),
    "kv_pool": dict(capacity_tokens=262144, used_tokens=4096, page_size=16, running=3, queued=5, max_running=64),
    "step": dict(
        step=1042,
        phase="decode",
        batch_size=3,
        num_tokens=3,
        bucket=4,
        padded=1,
        padding_waste=0.25,
        path="graph",
        host_ms=0.41,
        replay_ms=0.18,
    ),
    "rank_replay": dict(rank=1, steps=(1042, 1043, 1044), replay_ms=(0.19, 0.18, 0.18)),
    "parity_check": dict(
        step=1088,
        phase="decode",
        batch_size=3,
        num_tokens=3,
        bucket=4,
        rows=3,
        max_abs_err=0.0625,
        max_rel_err=0.0041,
        argmax_agree=1.0,
        top5_overlap=1.0,
        tolerance=0.05,
        check_ms=9.7,
        every=64,
        skipped=1,
    ),
    "parity_not_run": dict(step=1090, reason="discarded", skipped=1, discarded=1, every=64),
    "request_queued": dict(request_id="req-7", prompt_tokens=128, max_new_tokens=256),
    "request_first_token": dict(request_id="req-7", ttft_ms=21.5, queue_ms=3.2),
    "request_finished": dict(request_id="req-7", output_tokens=256, finish_reason="length", latency_ms=912.3),
    "recapture_requested": dict(decode_bs=(1, 2, 4, 8, 16)),
    "recapture_finished": dict(
        decode_bs=(1, 2, 4, 8, 16),
        prefill_num_tokens=(),
        seconds=1.4,
        memory_freed_bytes=25165824,
        memory_bytes=33554432,
        message="recaptured 5 decode buckets",
    ),
    "config_downgrade": dict(
        key="decode_bs", old=[1, 2, 4, 8, 16], new=[1, 2, 4, 8], reason="bucket 16 failed to capture (out of memory)"
    ),
    "error": dict(message="CUDA error: out of memory", where="capture", fatal=False),
}


def type_name(ann) -> str:
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if ann is typing.Any:
        return "any"
    if origin is typing.Union:
        inner = [a for a in args if a is not type(None)]
        return f"{type_name(inner[0])} or null"
    if origin is tuple:
        return f"list of {type_name(args[0])}"
    if ann is dict or origin is dict:
        return "object"
    return {int: "int", float: "number", str: "string", bool: "bool"}.get(ann, str(ann))


def render() -> str:
    out = []
    w = out.append
    w("# graphtop trace schema\n")
    w(
        "<!-- Generated from `engine/telemetry/events.py` by scripts/trace_schema_md.py; tests/telemetry/test_trace_tools.py"
    )
    w("     checks that it is current, that every type and field is documented and that every example validates.")
    w("     Edit DESCRIPTIONS/EXAMPLES in the script, not the tables. -->\n")
    w(f"Current `schema_version`: **{ev.SCHEMA_VERSION}**.\n")
    w("A trace is a UTF-8 [JSON Lines](https://jsonlines.org) file written by `graphtop ... --record PATH`")
    w("(`graphtop.engine.telemetry.recorder.TraceRecorder`):\n")
    w("* **Line 1 is always a `header`** carrying `schema_version`. Readers refuse a trace whose")
    w("  `schema_version` is newer than theirs; a change that renames, removes or retypes a field bumps the version.")
    w("* Every other line is one event object: `type` selects the event, all fields are always present")
    w("  (nullable ones as `null`), no extra fields are allowed. Lists are JSON arrays; objects are JSON objects.")
    w("  Exception: a field marked *added* arrived after its event type shipped; a trace written before may lack")
    w("  it, and readers then use its default.")
    w("* **Value limits:** every typed number (sizes, counts, durations, `ts`) is finite, non-negative and at")
    w("  most 2**63-1 (int) or 2**53 (float); numbers in free-form values (`meta`, `graph_config`, `old`/`new`)")
    w("  are finite 64-bit values nested at most 32 levels deep; strings are valid Unicode. `NaN`/`Infinity` are")
    w("  not JSON and are refused. A line outside these limits is reported as `path:LINE: message` like any")
    w("  other malformed line (including a line that is not a JSON object).")
    w("* **Consistency:** values no engine writes together are refused the same way")
    w("  (`graphtop.engine.telemetry.consistency`): a step has at least one token per request")
    w("  (`num_tokens >= batch_size`) and a `path` of `graph` or `eager`; a graph step has a bucket of at least")
    w("  its real rows (decode: `batch_size`) or tokens (prefill: `num_tokens`), never 0, `padded` is the bucket")
    w("  minus those, and `padding_waste` is `padded / bucket`; an eager step has no bucket and no padding. A")
    w("  `parity_check`'s bucket obeys the same rule, and its `argmax_agree` and `top5_overlap` are at most 1.")
    w("* Events appear in the order the engine published them. `ts` is wall-clock Unix seconds (float).")
    w("* **Crash safety:** the recorder hands the OS only whole lines, so a run that is killed (even with")
    w("  SIGKILL) or crashes leaves every complete line valid; only the *last* line can be cut short. Readers")
    w("  (`graphtop.engine.trace_tools.trace.read_trace`) skip such a final line without a newline and set")
    w("  `truncated_tail`; any other bad line is an error reported as `path:LINE: message`.")
    w("* Events the recorder could not keep up with are dropped (never stalling the engine) and are simply")
    w("  absent; gaps in `step.step` numbers reveal dropped steps.\n")
    w("Event types: " + ", ".join(f"[`{t}`](#{t})" for t in ev.EVENT_TYPES) + ".\n")
    for tag, cls in ev.EVENT_TYPES.items():
        hints = typing.get_type_hints(cls)
        w(f"## `{tag}`\n")
        doc = (cls.__doc__ or "").strip()
        if doc and not doc.startswith(cls.__name__ + "("):
            w(" ".join(doc.split()) + "\n")
        w("| field | type | meaning |")
        w("|---|---|---|")
        w(f'| `type` | string | always `"{tag}"` |')
        for f in dataclasses.fields(cls):
            key = "ts" if f.name == "ts" else f"{tag}.{f.name}"
            desc = DESCRIPTIONS[key]
            if f.metadata.get("added"):
                desc = f"*added* (absent in older traces: `{json.dumps(f.default)}`): {desc}"
            w(f"| `{f.name}` | {type_name(hints[f.name])} | {desc} |")
        example = cls(ts=TS, **EXAMPLES[tag]).to_dict()
        ev.validate_event_dict(json.loads(json.dumps(example)))
        w("\nExample:\n")
        w("```json")
        w(json.dumps(example, separators=(",", ":")))
        w("```\n")
    w("## Regenerating this file\n")
    w("This page is generated from the event classes: run `python3 scripts/trace_schema_md.py` from the")
    w("repository root after changing an event (`--check` says whether the page is current; a test runs it).")
    return "\n".join(out) + "\n"


DOC = Path(__file__).resolve().parents[1] / "docs" / "trace-schema.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/trace-schema.md is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = DOC.read_text(encoding="utf-8")
        if current != text:
            print("docs/trace-schema.md is stale: run python3 scripts/trace_schema_md.py")
            return 1
        return 0
    DOC.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
