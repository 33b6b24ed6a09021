"""The ``graphtop`` command line.

    graphtop [--model PATH] [engine options]                  the dashboard (demo model without --model)
    graphtop [--model PATH] --prompts FILE --output OUT.jsonl headless generation
    graphtop [--model PATH] --record TRACE.jsonl (--prompts FILE | --synthetic N)
    graphtop --replay TRACE.jsonl                             a recorded trace in the dashboard
    graphtop attach [ENDPOINT]                                the dashboard on a running engine
    graphtop ps                                               the engines one can attach to
    graphtop web [TARGET]                                     a running engine's dashboard, for browsers
    graphtop trace summary TRACE.jsonl
    graphtop trace report TRACE.jsonl -o report.html          charts in one offline HTML file
    graphtop trace export TRACE.jsonl OUT.json                 Perfetto JSON (--perfetto accepted)
    graphtop advise TRACE.jsonl [--max-graphs N] [--max-graph-memory SIZE] [--phase decode|prefill|both]

Usage errors print one line and exit 2, never a traceback. Textual is imported only for the
interactive modes, torch only once a model is needed. What ``--help`` says beyond each flag's own
line (the subcommands, examples, formats and defaults) is in ``help_text``; the engine and
CUDA-graph flags the main command shares with ``graphtop serve`` are in ``flags``, and the serve
command's parser in ``serve``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Any, Iterator, NoReturn, Optional, Sequence

from .flag_types import (
    MAX_FLAG_INT,
    MAX_SEED,
    MAX_SYNTHETIC_REQUESTS,
    file_path,
    finite_float,
    int_in,
    nonneg_int,
    positive_int,
    serve_address,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
# Read once, when torch loads OpenMP (torch is imported only later). OpenMP's default makes idle
# threads spin; on a small or busy CPU a spinning thread holds the core its team-mate needs, and a
# CPU decode step (hundreds of small parallel ops) then ran ~10x slower. Passive threads sleep.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from graphtop.engine.telemetry.plain_text import one_line  # noqa: E402

from .auto_tune_flags import add_auto_tune_flags  # noqa: E402
from .flags import _Parser, add_engine_flags, add_telemetry_flag, engine_config_from_args  # noqa: E402
from .headless import Terminated, interrupt_status  # noqa: E402
from .help_text import USAGE, HelpFormatter, commands_epilog, document  # noqa: E402
from .priority import PRIORITIES, PRIORITY_HELP, default_priority  # noqa: E402
from .stdout_guard import StdoutError, guarded_stdout, silence_stdout, stdout_error_line  # noqa: E402
from .usage import UsageError, error_line  # noqa: E402
from .workload import DEFAULT_OUTPUT_LEN, DEFAULT_PROMPT_LEN  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="graphtop",
        usage=USAGE,
        description="LLM inference with CUDA graphs you can watch.",
        epilog=commands_epilog(),
        formatter_class=HelpFormatter,
    )
    add_engine_flags(p)
    add_auto_tune_flags(p)
    h = p.add_argument_group("headless")
    h.add_argument("--prompts", type=file_path, metavar="FILE", help="one JSON object or plain text prompt per line")
    h.add_argument("--output", type=file_path, metavar="OUT.jsonl", help="one result line per request")
    h.add_argument("--record", type=file_path, metavar="TRACE.jsonl", help="save the event trace")
    h.add_argument(
        "--resume",
        action="store_true",
        help="finish a killed --prompts run: keep the results already in --output OUT.jsonl, run the "
        "other lines and append theirs",
    )
    h.add_argument(
        "--chat",
        action="store_true",
        help="send every prompt through the model's chat template (an Instruct model answers it); "
        'a prompt line\'s own "chat" decides for that line',
    )
    h.add_argument(
        "--synthetic",
        type=int_in(1, MAX_SYNTHETIC_REQUESTS),
        metavar="N",
        help=f"N seeded synthetic requests (at most {MAX_SYNTHETIC_REQUESTS:,})",
    )
    h.add_argument("--synthetic-prompt-len", default=DEFAULT_PROMPT_LEN, metavar="DIST")
    h.add_argument("--synthetic-output-len", default=DEFAULT_OUTPUT_LEN, metavar="DIST")
    h.add_argument(
        "--synthetic-rate",
        type=finite_float(0.0, lo_open=True),
        metavar="REQ_PER_S",
        help="Poisson arrival rate (default: all at once)",
    )
    h.add_argument("--seed", type=int_in(0, MAX_SEED), default=0)
    h.add_argument("--max-new-tokens", type=positive_int, default=128)
    h.add_argument("--temperature", type=finite_float(0.0), default=0.0)
    h.add_argument("--top-p", type=finite_float(), default=1.0)
    h.add_argument("--top-k", type=int_in(-MAX_FLAG_INT), default=0)
    u = p.add_argument_group("dashboard")
    u.add_argument("--theme", help="graphtop-dark (default), graphtop-light or any Textual theme")
    u.add_argument("--replay", type=file_path, metavar="TRACE.jsonl", help="open a recorded trace in the dashboard")
    u.add_argument(
        "--serve",
        type=serve_address,
        metavar="[HOST:]PORT",
        help="serve the OpenAI-compatible API of graphtop serve while the dashboard runs (host "
        "127.0.0.1 unless given; the API key, if any, from $GRAPHTOP_API_KEY)",
    )
    t = p.add_argument_group("telemetry")
    add_telemetry_flag(t)
    return document(p)


def build_attach_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="graphtop attach",
        description="Open the dashboard on a running engine; q detaches.",
        epilog="example:\n  graphtop --synthetic 1000 --telemetry   # a run others can watch\n"
        "  graphtop attach                         # from another terminal",
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "endpoint",
        nargs="?",
        metavar="ENDPOINT",
        help="a pid or endpoint from graphtop ps, or tcp://HOST:PORT (default: the one running engine)",
    )
    p.add_argument("--token", help="the endpoint's token (needed for an engine of another machine)")
    p.add_argument("--theme", help="graphtop-dark (default), graphtop-light or any Textual theme")
    p.add_argument("--priority", choices=PRIORITIES, default=default_priority(), help=PRIORITY_HELP)
    p.add_argument("--owner", type=int, help=argparse.SUPPRESS)  # the graphtop process that spawned this viewer
    p.add_argument("--no-device-poll", dest="poll_device", action="store_false", help=argparse.SUPPRESS)
    p.add_argument("--browser-tab", action="store_true", help=argparse.SUPPRESS)  # a tab of graphtop web
    p.add_argument("--max-queued-requests", type=nonneg_int, help=argparse.SUPPRESS)  # the API's, for a tab
    return document(p)


def build_ps_parser() -> argparse.ArgumentParser:
    return _Parser(
        prog="graphtop ps",
        description="List the engines of this user one can attach to: pid, model,\n"
        "device, uptime, endpoint (engines started with --telemetry, or engine.serve_telemetry()).",
        formatter_class=HelpFormatter,
    )


def build_trace_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="graphtop trace",
        description="Inspect recorded traces (graphtop --record, or Export trace in the dashboard).",
        formatter_class=HelpFormatter,
        epilog=(
            "examples:\n  graphtop trace summary run.jsonl\n  graphtop trace report run.jsonl -o report.html\n"
            "  graphtop trace export run.jsonl run.json"
        ),
    )
    sub = p.add_subparsers(dest="cmd", metavar="{summary,report,export}")
    s = sub.add_parser(
        "summary",
        help="a text report: steps, graph hit rate, fallbacks, capture, memory",
        description="A text report of a recorded trace.",
        formatter_class=HelpFormatter,
    )
    s.error = p.error  # type: ignore[method-assign]
    s.add_argument("trace", type=file_path, metavar="TRACE.jsonl", help="a trace written by graphtop")
    r = sub.add_parser(
        "report",
        help="charts in one HTML file that opens offline: steps, buckets, fallbacks, latency, KV, capture, advice",
        description="Write a recorded trace as one self-contained HTML page of charts (no network fetch).",
        formatter_class=HelpFormatter,
    )
    r.error = p.error  # type: ignore[method-assign]
    r.add_argument("trace", type=file_path, metavar="TRACE.jsonl", help="a trace written by graphtop")
    r.add_argument(
        "-o",
        "--out",
        type=file_path,
        metavar="OUT.html",
        help="where to write the page (default: TRACE's path ending in .html instead of its extension)",
    )
    e = sub.add_parser(
        "export",
        help="Perfetto (Chrome trace-event) JSON, to open at ui.perfetto.dev",
        description="Export a recorded trace as Perfetto (Chrome trace-event) JSON.",
        formatter_class=HelpFormatter,
    )
    e.error = p.error  # type: ignore[method-assign]
    e.add_argument(
        "--perfetto",
        action="store_true",
        help="Perfetto JSON: the only format, and the default (accepted for older scripts)",
    )
    e.add_argument("trace", type=file_path, metavar="TRACE.jsonl", help="a trace written by graphtop")
    e.add_argument("out", type=file_path, metavar="OUT.json", help="where to write the Perfetto JSON")
    return p


def _check_demo_cache() -> None:
    """The demo model's cache folder (GRAPHTOP_CACHE_DIR) is usable, before anything loads."""
    from graphtop.models import CheckpointError
    from graphtop.models.synthetic.demo import check_demo_cache

    try:
        check_demo_cache()
    except CheckpointError as e:
        raise UsageError(str(e)) from None


def _run_trace(argv: Sequence[str]) -> int:
    parser = build_trace_parser()
    args = parser.parse_args(argv)
    if args.cmd is None:  # "graphtop trace" alone: say what it can do
        parser.print_help()
        return 0
    if args.cmd == "report":
        from .trace_report import run_report

        return run_report(args)
    from graphtop.engine.telemetry.safe_write import OutputPathError

    from .trace_input import read_checked_trace

    trace = read_checked_trace(args.trace, args.out if args.cmd == "export" else None)
    if args.cmd == "summary":
        from graphtop.engine.trace_tools.report import format_summary
        from graphtop.engine.trace_tools.summary import summarize

        print(format_summary(summarize(trace)), end="")
        return 0
    from graphtop.engine.trace_tools.perfetto import write_perfetto

    try:
        out = write_perfetto(trace, args.out)
    except OSError as e:
        raise UsageError(f"cannot write {args.out}: {e.strerror or e}") from None
    except OutputPathError as e:
        raise UsageError(str(e)) from None
    print(f"wrote {one_line(str(out))} ({len(trace.events)} events); open it at ui.perfetto.dev")
    return 0


def _main(argv: Sequence[str]) -> int:
    if argv and argv[0] == "trace":
        return _run_trace(argv[1:])
    if argv and argv[0] == "advise":
        from .advise import build_advise_parser, run_advise

        return run_advise(build_advise_parser(_Parser).parse_args(argv[1:]))
    if argv and argv[0] == "attach":
        from graphtop.cli.attach import run_attach

        a = build_attach_parser().parse_args(argv[1:])
        return run_attach(
            a.endpoint,
            a.token,
            a.theme,
            owner_pid=a.owner,
            poll_device=a.poll_device,
            browser_tab=a.browser_tab,
            max_queued=a.max_queued_requests,
            priority=a.priority,
        )
    if argv and argv[0] == "serve":
        from .serve import read_serve_args

        args = read_serve_args(argv[1:])
        args.argv = list(argv)
        config = engine_config_from_args(args)
        if args.model is None:
            _check_demo_cache()
        from .serve import run_serve

        return run_serve(args, config)
    if argv and argv[0] == "web":
        from .web import build_web_parser, run_web

        return run_web(build_web_parser().parse_args(argv[1:]))
    if argv and argv[0] == "ps":
        extra = build_ps_parser().parse_known_args(argv[1:])[1]
        if extra:
            raise UsageError(f"graphtop ps takes no arguments (got {' '.join(extra)})")
        from graphtop.cli.attach import run_ps

        return run_ps()
    args = build_parser().parse_args(argv)
    args.argv = list(argv)  # what a trace header records: this call's arguments, not the process's
    if args.replay is not None:
        if args.prompts or args.synthetic or args.record or args.output:
            raise UsageError("--replay opens a trace; it cannot be combined with a workload or its outputs")
        if args.model is not None:
            raise UsageError("--replay opens a trace; there is no model to load with --model")
        if args.telemetry:
            raise UsageError("--replay opens a trace; there is no engine to serve with --telemetry")
        if args.serve:
            raise UsageError("--replay opens a trace; there is no engine to serve with --serve")
        from graphtop.cli.launch import run_replay

        return run_replay(args.replay, args.theme)
    if args.chat and not args.prompts:  # synthetic prompts are token ids; the dashboard has its own chat toggle
        raise UsageError("--chat applies to the lines of --prompts FILE")
    headless = bool(args.prompts or args.synthetic or args.record or args.output)
    if headless and args.serve:
        raise UsageError("--serve goes with the dashboard; for a server without one use graphtop serve")
    if args.auto_tune and not headless:
        raise UsageError(
            "--auto-tune is for headless runs (--prompts, --synthetic) and graphtop serve; the dashboard "
            "shows the advice live and applies it with one key"
        )
    config = engine_config_from_args(args)
    if headless:
        if args.model is None:
            _check_demo_cache()  # (the dashboard shows the same one-line error, without paying for torch first)
        from graphtop.cli.headless import run_headless

        return run_headless(args, config)
    if args.model is not None and not os.path.isdir(args.model):
        if not os.path.exists(args.model):
            raise UsageError(f"model folder {args.model} does not exist")
        if not (os.path.isfile(args.model) and args.model.lower().endswith(".gguf")):
            raise UsageError(f"model path {args.model} is not a folder (nor a .gguf file)")
    if args.device != "auto" or args.attention_backend == "flashinfer":
        # An explicit device or backend that cannot work fails here, not inside the dashboard.
        from graphtop.engine.attention.select import flashinfer_problem
        from graphtop.engine.engine import EngineError, resolve_device

        try:
            device = resolve_device(args.device)
        except EngineError as e:
            raise UsageError(str(e)) from None
        problem = flashinfer_problem(device) if args.attention_backend == "flashinfer" else None
        if problem:
            raise UsageError(f"--attention-backend flashinfer: {problem}")
    from graphtop.cli.launch import run_interactive

    serve = None
    if args.serve:
        from .serve import make_options

        host, port = args.serve  # no access log: its lines would be drawn over the dashboard
        serve = make_options(host, port, model=args.model, names=None, api_key=None, log_requests=False)
    return run_interactive(args.model, config, args.theme, telemetry=args.telemetry or "ipc", serve=serve)


def _on_sigterm(signum: int, frame: Any) -> NoReturn:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one is enough: a second must not cut the cleanup short
    raise Terminated()


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises Terminated while the CLI runs (the main thread only can set a handler).

    After a SIGTERM, further ones stay ignored to the end of the process: the run is ending by it, and a
    second one (a supervisor that sends another, a user who presses kill twice) landing after the CLI
    returned, while the interpreter shuts down, would end it by the signal instead of exit 143. Without
    a SIGTERM the caller's handler is put back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, previous)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        with _sigterm_interrupts(), guarded_stdout():
            return _main(argv)
    except UsageError as e:
        print(error_line(e), file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        word, status = interrupt_status(e)
        print(f"graphtop: {word}", file=sys.stderr)
        return status
    except StdoutError as e:
        silence_stdout()
        line = stdout_error_line(e)
        if line:
            print(error_line(line), file=sys.stderr)
        return 2 if line else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
