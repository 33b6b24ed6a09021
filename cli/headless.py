"""Headless runs: a prompts file or a synthetic workload, results to JSONL, events to a trace.

Every check that can fail because of the user's input (paths, prompts, config, --resume's OUT) runs
before the model loads, so a typo costs no load time. Output goes through ``safe_write``: an output that
names the prompts file, the trace or a file of the model is refused. OUT.jsonl gets each result the moment
its request finishes (``results_file``: a run killed with kill -9 keeps every finished result, and
``--resume`` finishes it), is put in place only once a result is written (a run that finishes nothing
leaves an older OUT.jsonl as it was) and is rewritten in request order when the run ends. The trace is
staged beside TRACE.jsonl too and put in place once the model has loaded: a run that fails before
serving anything leaves an older trace as it was.

Nothing finished is lost on the way out: an interrupted run (Ctrl-C, or SIGTERM, which the CLI turns
into the same exception) keeps the results finished so far and the trace, and a run whose --output or
trace could not be written says so and exits 2 even though the work itself was done.
"""

from __future__ import annotations

import os
import signal
import stat
import sys
import time
from typing import Any, Optional

from graphtop.engine.gc_freeze import frozen_heap
from graphtop.engine.telemetry.plain_text import one_line
from graphtop.engine.telemetry.safe_write import OutputPathError

from .auto_tune_flags import start_auto_tune
from .prompts_file import PromptLine, PromptsFileError, read_prompts
from .results_file import ResultsFile, result_line
from .resume import Resumed, drop_unkept, read_resume
from .serving import Served, has_chat_template
from .serving import sampling as _sampling  # the names tests patch and read
from .serving import serve as _serve
from .usage import UsageError, print_error


def model_files(model: Optional[str]) -> list[tuple[str, str]]:
    """The files a run reads its model from, as (label, path): a .gguf file and the files of its converted
    folder in the cache, or the regular files at the top of a checkpoint folder (the demo model's cache
    folder without --model)."""
    if model is None:
        from graphtop.models.synthetic.demo import DEMO_DIRNAME, demo_cache_root

        return _top_files(str(demo_cache_root() / DEMO_DIRNAME), "a file of the demo model")
    if os.path.isdir(model):
        return _top_files(model, "a file of --model")
    return [("--model", model), *_converted_files(model)]


def _converted_files(model: str) -> list[tuple[str, str]]:
    """For a .gguf, the files of its converted folder (which every later load reads instead of the .gguf)."""
    if not model.lower().endswith(".gguf") or not os.path.isfile(model):
        return []
    from graphtop.models import CheckpointError
    from graphtop.models.checkpoint.gguf import converted_folder

    try:
        folder = converted_folder(model)
    except (CheckpointError, OSError, RuntimeError):  # the load fails on the same problem, with its own line
        return []
    return _top_files(str(folder), "a file of --model's converted folder")


def _top_files(folder: str, label: str) -> list[tuple[str, str]]:
    try:
        return [(label, e.path) for e in os.scandir(folder) if e.is_file()]
    except OSError:  # missing (not converted yet) or unlistable: the load says what is wrong, if anything
        return []


def check_output_paths(args: Any) -> None:
    """--output and --record: writable, and neither the prompts file, a file of the model nor each other."""
    from graphtop.engine.telemetry.safe_write import OutputPathError, check_distinct, check_output

    outputs = [("--output", args.output), ("--record", args.record)]
    try:
        for flag, path in outputs:
            if path is not None:
                check_output(path, flag, probe=True)
        check_distinct(outputs, [("--prompts", args.prompts), *model_files(args.model)])
    except OutputPathError as e:
        raise UsageError(str(e)) from None


#: The longest a synthetic workload's arrivals may be spread over, on average: a rate that puts them
#: further apart (a typo such as 1e-9 for 1e9) would keep a headless run waiting for years.
MAX_SYNTHETIC_SPAN_S = 24 * 3600


def _check_synthetic_span(n: int, rate: Optional[float]) -> None:
    if rate is None or n < 2:
        return
    span = (n - 1) / rate
    if span > MAX_SYNTHETIC_SPAN_S:
        raise UsageError(
            f"--synthetic-rate {rate:g} spreads {n} requests over ~{span / 3600:.3g} hours on average; "
            f"at most {MAX_SYNTHETIC_SPAN_S // 3600} hours (a rate of at least {(n - 1) / MAX_SYNTHETIC_SPAN_S:.3g})"
        )


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


def _open_recorder(args: Any, bus: Any) -> Any:
    """The --record trace, staged beside its path until the model has loaded (None without --record)."""
    from graphtop.engine.telemetry.recorder import RecorderError, TraceRecorder

    if not args.record:
        return None
    meta = {
        "argv": args.argv,
        "model": args.model or "demo",
        "workload": f"synthetic {args.synthetic}" if args.synthetic else f"prompts {args.prompts}",
    }
    try:
        return TraceRecorder(args.record, bus, header_meta=meta, publish=False)
    except RecorderError as e:
        raise UsageError(str(e)) from None


def _publish(recorder: Any) -> None:
    from graphtop.engine.telemetry.recorder import RecorderError

    try:
        recorder.publish()
    except RecorderError as e:
        raise UsageError(str(e)) from None


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as a Ctrl-C is: every cleanup an interrupt runs (a staged trace
    removed, finished results written, the dashboard's viewer stopped) then runs for a kill too, where
    the default action would end the process on the spot and leave temporary files behind."""


def interrupt_status(exc: KeyboardInterrupt) -> tuple[str, int]:
    """The word the CLI says for an interrupt, and the exit status (128 + the signal, the shell's rule)."""
    if isinstance(exc, Terminated):
        return "terminated", 128 + signal.SIGTERM
    return "interrupted", 128 + signal.SIGINT


def _check_workload_flags(args: Any) -> None:
    if args.record and not (args.prompts or args.synthetic):
        raise UsageError("--record needs a workload: --prompts FILE or --synthetic N")
    if args.prompts and args.synthetic:
        raise UsageError("choose one workload: --prompts FILE or --synthetic N")
    if args.output and not (args.prompts or args.synthetic):
        raise UsageError("--output needs a workload: --prompts FILE or --synthetic N")
    if args.resume and not (args.prompts and args.output):
        raise UsageError("--resume finishes a --prompts FILE --output OUT.jsonl run from the results in OUT")


def run_headless(args: Any, config: Any) -> int:
    _check_workload_flags(args)
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
        from graphtop.cli.workload import Dist

        try:
            Dist.parse(args.synthetic_prompt_len)
            Dist.parse(args.synthetic_output_len)
        except ValueError as e:
            raise UsageError(str(e)) from None
        _check_synthetic_span(args.synthetic, args.synthetic_rate)
    check_output_paths(args)
    resumed = read_resume(args.output, args.prompts, lines) if args.resume else None
    to_serve = resumed.to_serve(lines) if resumed is not None else lines
    for pl in to_serve:
        if pl.error:
            print_error(f"{args.prompts}:{pl.error}")

    from graphtop.engine.telemetry.bus import EventBus

    from .progress import start_headless_progress

    bus = EventBus()
    recorder = server = engine = progress = out = tuner = None
    served: Optional[Served] = None
    serving = False  # the model loaded and the trace is at its path: what follows is kept
    try:  # from the trace's staging on: an interrupt (Ctrl-C, SIGTERM) at any point runs the clean-up below
        recorder = _open_recorder(args, bus)
        out = _results_file(args, resumed)  # assigned before it opens: an interrupt while opening is cleaned up
        if out is not None:
            _open_results(out, args)
        total = args.synthetic or sum(1 for pl in to_serve if not pl.error)
        progress = start_headless_progress(bus, total)  # None unless stderr is a terminal
        if args.telemetry:  # an endpoint viewers can attach to from before the model loads
            from .endpoint import open_endpoint

            server = open_endpoint(bus, args.telemetry, args.model or "demo model")
        engine = _load_engine(args, config, bus)
        if args.chat and not has_chat_template(engine):
            raise UsageError("--chat: the model has no chat template (its tokenizer defines none)")
        if recorder is not None:
            _publish(recorder)
        serving = True
        if server is not None:
            engine.serve_telemetry(server=server)
        if args.synthetic:
            from graphtop.cli.workload import for_engine

            synthetic = for_engine(
                engine,
                args.synthetic,
                args.seed,
                prompt_len=args.synthetic_prompt_len,
                output_len=args.synthetic_output_len,
                arrival_rate=args.synthetic_rate,
            )
        tuner = start_auto_tune(engine, args)
        t0 = time.perf_counter()
        with frozen_heap():  # the loaded heap out of the collector's way while the engine serves
            served = _serve(engine, args, to_serve, synthetic, out.add if out is not None else None)
        wall = time.perf_counter() - t0
    finally:
        if server is not None:
            server.close("the headless run finished")
        if tuner is not None:
            tuner.close()
        if engine is not None:
            engine.close("engine closed")  # stops tensor-parallel workers, too
        if progress is not None:
            progress.stop()
        rec_result = None
        if recorder is not None and serving:
            rec_result = recorder.close()
        elif recorder is not None:
            recorder.discard()  # nothing was served: an older trace at the path stays
        if out is not None and served is None:
            out.finish(None)  # stopped before serving, or by an error: OUT keeps what was written, if anything
    if served.interrupted is not None:
        return _end_interrupted(
            args, served, len(to_serve) if not args.synthetic else args.synthetic, rec_result, out, resumed
        )
    results = resumed.merged(lines, to_serve, served.results) if resumed is not None else served.results
    output_error = out.finish(results) if out is not None else None  # before the summary: it is the user's data
    unreadable = _print_summary(args, served.results, wall, rec_result)
    if resumed is not None:
        print(
            f"resumed: {len(resumed.kept)} results were already in {args.output}; {args.output} holds "
            f"{len(results)} of {len(lines)}"
        )
    lost = [e for e in (output_error, rec_result.error_line if rec_result else None) if e]
    for line in lost:  # each output that is not all there, even when both are
        print_error(line)
    if served.failure:  # the engine cannot go on (e.g. a tensor-parallel rank died): what was done is written
        print_error(served.failure)
    if lost or unreadable:
        return 2  # as any other output that cannot be written (or read back: said in the summary's place)
    bad = served.failure or any(r.get("error") for r in results)
    return 1 if bad else 0


def _results_file(args: Any, resumed: Optional[Resumed]) -> Optional[ResultsFile]:
    if not args.output:
        return None
    if resumed is not None:
        drop_unkept(args.output, resumed)
    return ResultsFile(args.output, resume=resumed is not None)


def _open_results(out: ResultsFile, args: Any) -> None:
    try:
        out.open()
    except OutputPathError as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError(f"cannot write {args.output}: {e.strerror or e}") from None


def _end_interrupted(
    args: Any, served: Served, total: int, rec_result: Any, out: Optional[ResultsFile], resumed: Optional[Resumed]
) -> int:
    """Ctrl-C or SIGTERM while serving: keep what finished, and say in one line what was kept."""
    assert served.interrupted is not None
    word, status = interrupt_status(served.interrupted)
    said = []
    if out is not None:
        error = out.finish(None)
        before = len(resumed.kept) if resumed is not None else 0
        if error:
            said.append(error)
        elif out.written or before:
            earlier = f" ({before} of them by an earlier run; --resume finishes it)" if before else ""
            said.append(f"{out.written + before} of {total + before} results written to {args.output}{earlier}")
        else:
            said.append(f"no request had finished; {args.output} left as it was")
    if rec_result is not None:
        said.append(rec_result.error_line or f"trace {args.record} kept")
    print(one_line(f"graphtop: {word}: {'; '.join(said)}" if said else f"graphtop: {word}"), file=sys.stderr)
    return status


_result_line = result_line  # the name the prompt-line fuzz tests read results back with


def _print_summary(args: Any, results: list[dict], wall: float, rec_result: Any) -> bool:
    """Print the run's summary and the trace's; True when the trace this run wrote cannot be read back."""
    done = [r for r in results if not r.get("error")]
    tokens = sum(len(r["token_ids"]) for r in done)
    print(
        f"requests {len(results)} ({len(results) - len(done)} failed) · output tokens {tokens} · "
        f"{wall:.2f} s · {tokens / wall if wall > 0 else 0:.1f} tok/s"
    )
    for r in results:
        if r.get("error"):
            print(f"  {one_line(str(r['id']))}: {one_line(str(r['error']))}")  # the prompts file's, the engine's
    if rec_result is not None:
        print(one_line(rec_result.describe()))
        if not _summarizable(rec_result):
            return False
        from graphtop.engine.trace_tools.report import format_summary
        from graphtop.engine.trace_tools.summary import summarize
        from graphtop.engine.trace_tools.trace import TraceError, read_trace

        try:
            print(format_summary(summarize(read_trace(args.record))), end="")
        except TraceError as e:
            print_error(f"could not summarize {args.record}: {e}")
            return True
    return False


def _summarizable(rec_result: Any) -> bool:
    """Whether the trace can be read back for its summary: only a complete one, in a regular file. A
    device or FIFO (``/dev/stdout`` into a pipe) cannot be read back (reading it would wait forever), and a
    trace that failed or was replaced is not this run's whole trace."""
    if rec_result.write_error is not None:
        return False
    try:
        return stat.S_ISREG(os.stat(rec_result.path).st_mode)
    except OSError:
        return False
