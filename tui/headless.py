"""Headless runs: a prompts file or a synthetic workload, results to JSONL, events to a trace.

Every check that can fail because of the user's input (paths, prompts, config) runs before the model
loads, so a typo costs no load time. Output is written to a temporary file beside the target and
renamed at the end: an interrupted run never leaves a half-written OUT.jsonl over an older one.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from .cli import UsageError
from .prompts_file import PromptLine, PromptsFileError, read_prompts


def check_writable(path: str, flag: str) -> None:
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{flag} {path} is a directory")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.exists():
        raise UsageError(f"{flag} {path}: folder {parent} does not exist")
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: {parent} is not a folder")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UsageError(f"{flag} {path} is not writable")


def _load_engine(args: Any, config: Any, bus: Any) -> Any:
    from graphtop.engine.attention.select import AttentionBackendError
    from graphtop.engine.engine import Engine, EngineError
    from graphtop.engine.graphs.config import GraphConfigError
    from graphtop.engine.memory_plan import MemoryPlanError
    from graphtop.models import CheckpointError

    try:
        return Engine.from_pretrained(args.model, config=config, bus=bus)
    except (CheckpointError, EngineError, GraphConfigError, MemoryPlanError, AttentionBackendError) as e:
        raise UsageError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None


def _sampling(args: Any, line: Optional[PromptLine]) -> Any:
    from graphtop.engine.sampling_params import SamplingParams

    base = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                top_k=args.top_k)
    if line is not None:
        base.update(line.sampling)
        if "stop" in base and isinstance(base["stop"], list):
            base["stop"] = tuple(base["stop"])
    return SamplingParams(**base)


def run_headless(args: Any, config: Any) -> int:
    if args.record and not (args.prompts or args.synthetic):
        raise UsageError("--record needs a workload: --prompts FILE or --synthetic N")
    if args.prompts and args.synthetic:
        raise UsageError("choose one workload: --prompts FILE or --synthetic N")
    if args.output and not (args.prompts or args.synthetic):
        raise UsageError("--output needs a workload: --prompts FILE or --synthetic N")
    try:  # the command-line sampling options themselves (--top-k -1, --top-p 0, ...)
        _sampling(args, None)
    except (TypeError, ValueError) as e:
        raise UsageError(f"bad sampling option: {e}") from None
    lines: list[PromptLine] = []
    if args.prompts:
        try:
            lines = read_prompts(args.prompts)
        except PromptsFileError as e:
            raise UsageError(str(e)) from None
        if args.prompts and not args.output and not args.record:
            raise UsageError("--prompts needs --output OUT.jsonl (or --record TRACE.jsonl)")
    synthetic = None
    if args.synthetic:
        from graphtop.tui.workload import Dist

        try:
            Dist.parse(args.synthetic_prompt_len)
            Dist.parse(args.synthetic_output_len)
        except ValueError as e:
            raise UsageError(str(e)) from None
        if args.synthetic_rate is not None and args.synthetic_rate <= 0:
            raise UsageError("--synthetic-rate must be positive")
    if args.output:
        check_writable(args.output, "--output")
    for pl in lines:
        if pl.error:
            print(f"graphtop: {args.prompts}:{pl.error}", file=sys.stderr)
        else:
            try:
                _sampling(args, pl)
            except (TypeError, ValueError) as e:
                pl.error = f"line {pl.line}: {e}"
                print(f"graphtop: {args.prompts}:{pl.error}", file=sys.stderr)

    from graphtop.engine.telemetry.bus import EventBus

    bus = EventBus()
    recorder = None
    if args.record:
        from graphtop.engine.telemetry.recorder import RecorderError, TraceRecorder

        check_writable(args.record, "--record")
        meta = {"argv": sys.argv[1:], "model": args.model or "demo", "workload":
                f"synthetic {args.synthetic}" if args.synthetic else f"prompts {args.prompts}"}
        try:
            recorder = TraceRecorder(args.record, bus, header_meta=meta)
        except RecorderError as e:
            raise UsageError(str(e)) from None
    from .progress import start_headless_progress

    total = args.synthetic or sum(1 for pl in lines if not pl.error)
    progress = start_headless_progress(bus, total)  # None unless stderr is a terminal
    try:
        engine = _load_engine(args, config, bus)
        if args.synthetic:
            from graphtop.tui.workload import SyntheticWorkload

            avoid = set(engine.spec.eos_token_ids) | set(getattr(engine.tokenizer, "all_special_ids", []) or [])
            synthetic = SyntheticWorkload(
                args.synthetic, args.seed, prompt_len=args.synthetic_prompt_len,
                output_len=args.synthetic_output_len, arrival_rate=args.synthetic_rate,
                vocab_size=engine.spec.vocab_size, avoid_ids=sorted(avoid),
                max_total_tokens=engine.max_context_len - 1,
            )
        t0 = time.perf_counter()
        results = _serve(engine, args, lines, synthetic)
        wall = time.perf_counter() - t0
    finally:
        if progress is not None:
            progress.stop()
        rec_result = recorder.close() if recorder is not None else None
    if args.output:
        _write_output(args.output, results)
    _print_summary(args, results, wall, rec_result)
    bad = sum(1 for r in results if r.get("error"))
    return 1 if bad else 0


def _serve(engine: Any, args: Any, lines: list[PromptLine], synthetic: Any) -> list[dict]:
    from graphtop.engine.sampling_params import SamplingParams

    slots: list[Any] = []  # dict (already-failed line) or RequestHandle, in input order
    if synthetic is None:
        for pl in lines:
            if pl.error:
                slots.append({"id": pl.id or f"line-{pl.line}", "prompt": None, "text": "", "token_ids": [],
                              "finish_reason": "rejected", "error": pl.error})
            else:
                slots.append(engine.submit(pl.prompt, _sampling(args, pl),
                                           request_id=pl.id or f"line-{pl.line}"))
        engine.run_until_idle()
    else:
        pending = list(synthetic)
        start = time.perf_counter()
        while pending or engine.scheduler.has_work():
            now = time.perf_counter() - start
            while pending and pending[0].arrival_s <= now:
                r = pending.pop(0)
                params = SamplingParams(max_new_tokens=r.max_new_tokens, temperature=args.temperature,
                                        top_p=args.top_p, top_k=args.top_k, seed=args.seed + r.index,
                                        ignore_eos=True)
                slots.append(engine.submit(r.prompt_token_ids, params, request_id=f"syn-{r.index}"))
            if not engine.step() and pending:
                time.sleep(min(0.01, max(0.0, pending[0].arrival_s - (time.perf_counter() - start))))
    out = []
    for s in slots:
        out.append(s if isinstance(s, dict) else s.result())
    return out


def _write_output(path: str, results: list[dict]) -> None:
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=str(target.parent or "."))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for r in results:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        os.replace(tmp, target)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        print(f"graphtop: error: cannot write {path}: {e.strerror or e}", file=sys.stderr)
        raise SystemExit(1) from None


def _print_summary(args: Any, results: list[dict], wall: float, rec_result: Any) -> None:
    done = [r for r in results if not r.get("error")]
    tokens = sum(len(r["token_ids"]) for r in done)
    print(f"requests {len(results)} ({len(results) - len(done)} failed) · output tokens {tokens} · "
          f"{wall:.2f} s · {tokens / wall if wall > 0 else 0:.1f} tok/s")
    for r in results:
        if r.get("error"):
            print(f"  {r['id']}: {r['error']}")
    if rec_result is not None:
        print(rec_result.describe())
        from graphtop.engine.telemetry.trace import TraceError, read_trace
        from graphtop.engine.telemetry.report import format_summary, summarize

        try:
            print(format_summary(summarize(read_trace(args.record))), end="")
        except TraceError as e:
            print(f"graphtop: could not summarize {args.record}: {e}", file=sys.stderr)
