"""``graphtop serve``: the engine behind an OpenAI-compatible HTTP API, headless, until Ctrl-C or SIGTERM.

Everything that can fail because of the command line runs before the model loads: the server options,
the --record path, and the listening socket itself (a port in use is one line and costs no load). The
metrics collector and the trace recorder subscribe to the bus before the engine exists, so the capture
of its graphs is in both, and ``/metrics`` counts exactly what the trace records. ``build_serve_parser``
is its command line: the engine and CUDA-graph flags of ``flags``, plus the server's own.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from typing import Any, Optional, Sequence

from graphtop.engine.gc_freeze import frozen_heap

from .auto_tune_flags import add_auto_tune_flags, start_auto_tune
from .flag_types import MAX_SEED, file_path, finite_float, int_in, nonempty, nonneg_int, positive_int, serve_address
from .flags import _Parser, add_engine_flags, add_telemetry_flag
from .help_text import HelpFormatter, document
from .usage import UsageError, print_error

API_KEY_ENV = "GRAPHTOP_API_KEY"
"""Where the API key may come from instead of --api-key (argv is visible to every user of the machine)."""
POLL_S = 0.5


def build_serve_parser() -> argparse.ArgumentParser:
    from graphtop.server import options as o

    p = _Parser(
        prog="graphtop serve",
        formatter_class=HelpFormatter,
        description="Serve a model over an OpenAI-compatible HTTP API: /v1/completions, /v1/chat/completions,\n"
        "/v1/models, /health, and Prometheus metrics at /metrics. Headless; every engine and\n"
        "CUDA-graph flag of graphtop applies, and vLLM's and SGLang's names for them too.\n"
        "Ctrl-C (or SIGTERM) stops it, letting the requests in flight finish first.",
        epilog="examples:\n  graphtop serve ~/models/Qwen3-0.6B --port 8000\n"
        "  graphtop serve --record served.jsonl --telemetry   # watch: graphtop attach\n"
        "  graphtop advise served.jsonl                        # buckets for that traffic",
    )
    p.add_argument(
        "model_path",
        nargs="?",
        type=file_path,
        metavar="MODEL",
        help="the model, as --model gives it (vLLM's and SGLang's positional form)",
    )
    add_engine_flags(p)
    s = p.add_argument_group("server")
    s.add_argument(
        "--host",
        default=o.DEFAULT_HOST,
        metavar="HOST",
        help="address to listen on (another than loopback without --api-key prints a warning)",
    )
    s.add_argument(
        "--port",
        type=int_in(0, 65535),
        default=o.DEFAULT_PORT,
        metavar="PORT",
        help="port to listen on (0: a free one, printed at start)",
    )
    s.add_argument(
        "--api-key",
        type=nonempty("API key"),
        metavar="KEY",
        help="clients of /v1 must send Authorization: Bearer KEY (default: $GRAPHTOP_API_KEY, else none)",
    )
    s.add_argument(
        "--max-queued-requests",
        type=nonneg_int,
        default=o.DEFAULT_MAX_QUEUED,
        metavar="N",
        help="requests that may wait beyond the running batch; past them a request gets 429",
    )
    s.add_argument(
        "--served-model-name",
        type=nonempty("name"),
        nargs="+",
        metavar="NAME",
        help="the model id of /v1/models and of responses (default: the model's folder or file name, demo "
        "for the demo); more names are accepted in requests and listed too, as vLLM's",
    )
    s.add_argument(
        "--seed",
        type=int_in(0, MAX_SEED),
        metavar="N",
        help="the sampling seed of requests that give none, so a repeated request gets the same answer "
        "(default: none, each such request samples afresh)",
    )
    s.add_argument(
        "--record",
        type=file_path,
        metavar="TRACE.jsonl",
        help="save the event trace of what was served (graphtop advise reads it)",
    )
    s.add_argument(
        "--disable-log-requests",
        action="store_true",
        help="no access log line per request on stderr (errors included)",
    )
    c = p.add_argument_group("connections")
    seconds = finite_float(0.0, 1e6)
    c.add_argument(
        "--timeout-keep-alive",
        type=seconds,
        default=o.DEFAULT_KEEP_ALIVE_S,
        metavar="S",
        help="close a keep-alive connection idle this long",
    )
    c.add_argument(
        "--timeout-headers",
        type=seconds,
        default=o.DEFAULT_HEADER_TIMEOUT_S,
        metavar="S",
        help="close a connection that has not sent a request's headers this long after it opened (or after "
        "its last response)",
    )
    c.add_argument(
        "--max-connections",
        type=positive_int,
        metavar="N",
        help="open connections at most; past them the oldest idle one is closed (default: what the open-file "
        "limit leaves, ulimit -n)",
    )
    c.add_argument(
        "--timeout-graceful-shutdown",
        type=seconds,
        default=o.DEFAULT_SHUTDOWN_TIMEOUT_S,
        metavar="S",
        help="on Ctrl-C or SIGTERM, how long requests in flight may take to finish; then each stream gets "
        "a last error chunk and [DONE]",
    )
    t = p.add_argument_group("telemetry")
    add_telemetry_flag(t)
    t.add_argument(
        "--dashboard",
        nargs="?",
        const="",
        type=dashboard_address,
        metavar="[HOST:]PORT",
        help="serve the dashboard to browsers too (as graphtop web): on --host, port 8001, unless given; "
        "with --api-key, browsers must give the key (?token=KEY); off loopback without one, a token is "
        "printed once",
    )
    t.add_argument(
        "--dashboard-max-tabs",
        type=int_in(1, 1000),
        default=16,
        metavar="N",
        help="browser tabs the dashboard serves at once; past them a page says it is full",
    )
    add_auto_tune_flags(p)
    return document(p)


def dashboard_address(text: str) -> Any:
    """``--dashboard``'s value: "" (the flag alone: --host, the dashboard's default port) or [HOST:]PORT."""
    return text if text == "" else serve_address(text)


def read_serve_args(argv: Sequence[str]) -> argparse.Namespace:
    """``graphtop serve``'s arguments; the positional model and ``--model`` are one setting."""
    args = build_serve_parser().parse_args(argv)
    if args.model_path is not None:
        if args.model is not None and args.model != args.model_path:
            raise UsageError(f"two models: {args.model_path} and --model {args.model}; give one")
        args.model = args.model_path
    _check_names_took_no_model(args)
    return args


def _check_names_took_no_model(args: argparse.Namespace) -> None:
    """``--served-model-name a ~/models/X`` reads the model as a second name (the flag takes several, as
    vLLM's): with no model given otherwise, a last name that is a path on disk is refused, not served as a
    name of the demo model."""
    names = args.served_model_name or []
    if args.model is None and len(names) > 1 and os.path.exists(os.path.expanduser(names[-1])):
        raise UsageError(f"--served-model-name took {names[-1]} as a name; put the model first or give it with --model")


def serve_options(args: Any) -> Any:
    """The ServeOptions of ``graphtop serve``'s command line (UsageError for a bad value); the key falls
    back to the environment's."""
    return make_options(
        args.host,
        args.port,
        model=args.model,
        names=args.served_model_name,
        api_key=args.api_key,
        max_queued_requests=args.max_queued_requests,
        seed=args.seed,
        log_requests=not args.disable_log_requests,
        timeout_keep_alive=args.timeout_keep_alive,
        timeout_headers=args.timeout_headers,
        max_connections=args.max_connections,
        shutdown_timeout=args.timeout_graceful_shutdown,
    )


def make_options(
    host: str,
    port: int,
    *,
    model: Optional[str],
    names: Optional[Sequence[str]],
    api_key: Optional[str],
    **more: Any,
) -> Any:
    """ServeOptions (UsageError for a bad value): the served names (the first one reported) from the model's
    path unless given, the API key from the environment unless given. ``more``: ServeOptions' other fields."""
    from graphtop.server.options import ServeOptions, model_name_for

    try:
        return ServeOptions(
            host=host,
            port=port,
            api_key=api_key or os.environ.get(API_KEY_ENV) or None,
            model_name=names[0] if names else model_name_for(model),
            model_aliases=tuple(names[1:]) if names else (),
            model_root=model,
            **more,
        )
    except ValueError as e:
        raise UsageError(str(e)) from None


def bind(options: Any) -> Any:
    """The listening socket, bound before the model loads; UsageError when it cannot be."""
    from graphtop.server.server import ServeError, listen

    try:
        return listen(options.host, options.port)
    except ServeError as e:
        raise UsageError(str(e)) from None


def warn_if_exposed(options: Any) -> None:
    from graphtop.server.options import exposure_warning

    warning = exposure_warning(options)
    if warning:
        print(f"graphtop: warning: {warning}", file=sys.stderr, flush=True)


def _check_record(args: Any) -> None:
    from graphtop.engine.telemetry.safe_write import OutputPathError, check_distinct, check_output

    from .headless import model_files

    if args.record is None:
        return
    try:
        check_output(args.record, "--record", probe=True)
        check_distinct([("--record", args.record)], model_files(args.model))
    except OutputPathError as e:
        raise UsageError(str(e)) from None


def _recorder(args: Any, bus: Any) -> Any:
    from graphtop.engine.telemetry.recorder import RecorderError, TraceRecorder

    if args.record is None:
        return None
    meta = {"argv": args.argv, "model": args.model or "demo", "workload": "served over HTTP (graphtop serve)"}
    try:
        return TraceRecorder(args.record, bus, header_meta=meta, publish=False)
    except RecorderError as e:
        raise UsageError(str(e)) from None


def run_serve(args: Any, config: Any) -> int:
    """Serve until Ctrl-C or SIGTERM. The API answers from before the model loads (``/health`` 503 until it
    serves), and stops gracefully: the requests in flight get ``--timeout-graceful-shutdown`` seconds."""
    options = serve_options(args)
    _check_record(args)
    sock = bind(options)
    warn_if_exposed(options)

    from graphtop.engine.telemetry.bus import EventBus
    from graphtop.engine.telemetry.metrics import MetricsCollector
    from graphtop.engine.telemetry.recorder import RecorderError
    from graphtop.server.server import ApiServer, ServeError

    from .headless import _load_engine
    from .serve_progress import say, start_load_lines

    bus = EventBus()
    metrics = MetricsCollector(bus)
    recorder = endpoint = engine = api = lines = web = tuner = None
    serving = False
    stopped = "stopped"
    log_handlers = _log_to_stderr()
    try:
        recorder = _recorder(args, bus)
        if args.telemetry or args.dashboard is not None:
            from .endpoint import open_endpoint

            # the dashboard's tabs attach to an endpoint: a private one unless --telemetry names one
            address = args.telemetry or "ipc"
            endpoint = open_endpoint(bus, address, args.model or "demo model", say_where=bool(args.telemetry))
        if args.dashboard is not None:
            web = _dashboard(args, options, endpoint)
        try:
            api = ApiServer(None, options, metrics=metrics, sock=sock).start()
        except ServeError as e:
            raise UsageError(str(e)) from None
        started = time.perf_counter()
        lines = start_load_lines(bus, args.model, f"{api.url}/health")
        engine = _load_engine(args, config, bus)
        if recorder is not None:
            try:
                recorder.publish()
            except RecorderError as e:
                raise UsageError(str(e)) from None
        serving = True
        if endpoint is not None:
            engine.serve_telemetry(server=endpoint)
        engine.start_background()
        tuner = start_auto_tune(engine, args, log_to_stderr=False)  # LOGGERS has its lines
        api.attach(engine)
        lines.stop()
        lines = None
        say(f"graphtop: ready in {time.perf_counter() - started:.1f} s")
        print(
            f"graphtop: serving {' · '.join(options.served_names)} at {api.url}/v1 (OpenAI API) · {api.url}/metrics · "
            f"{api.url}/health — Ctrl-C stops",
            file=sys.stderr,
            flush=True,
        )
        wait = threading.Event()
        with frozen_heap():  # the loaded heap out of the collector's way while the engine serves
            while api.running:
                wait.wait(POLL_S)
        stopped = "the API server stopped"
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: the way a server is stopped
        from .headless import interrupt_status

        stopped = f"stopped ({interrupt_status(e)[0]})"
    finally:
        if lines is not None:
            lines.stop()
        if web is not None:
            web.close()
        if api is not None:
            ended = _close_gracefully(api)
            if ended:
                stopped += f"; {ended} request(s) did not finish within --timeout-graceful-shutdown"
        if endpoint is not None:
            endpoint.close("graphtop serve stopped")
        if tuner is not None:
            tuner.close()
        if engine is not None:
            engine.close("the server stopped")
        metrics.close()
        sock.close()
        _unlog(log_handlers)
        rec_result = None
        if recorder is not None and serving:
            rec_result = recorder.close()
        elif recorder is not None:
            recorder.discard()
    line = f"graphtop: {stopped}"
    if rec_result is not None:
        line += f"; {rec_result.describe()}"
    print(line, file=sys.stderr, flush=True)
    if rec_result is not None and rec_result.error_line:
        print_error(rec_result.error_line)
        return 2
    return 0 if stopped.startswith("stopped") else 1


def _dashboard(args: Any, options: Any, endpoint: Any) -> Any:
    """The browser dashboard beside the API, started (its tabs show the load): the API's key and its
    --max-queued-requests hold for it too."""
    from .web_server import DEFAULT_PORT
    from .web_start import announce, make_dashboard

    host, port = (options.host, DEFAULT_PORT) if args.dashboard == "" else args.dashboard
    dashboard = make_dashboard(
        endpoint.endpoint,
        endpoint.token,
        host=host,
        port=port,
        key=options.api_key,
        label=options.model_name,
        max_tabs=args.dashboard_max_tabs,
        max_queued=options.max_queued_requests,
    ).start()
    announce(dashboard)
    return dashboard


def _close_gracefully(api: Any) -> int:
    """Stop the API, the requests in flight given their time; a second Ctrl-C ends them at once. How many
    were still running when the time ran out."""
    try:
        api.close()
    except KeyboardInterrupt:
        api.close(now=True)
    return int(api.ended_at_shutdown)


LOGGERS = ("graphtop.serve", "graphtop.auto_tune", "uvicorn.error")
"""The server's loggers (its access log and connection problems, auto-tune's recaptures, uvicorn's own):
lines on stderr."""


def _log_to_stderr() -> list[tuple[logging.Logger, logging.Handler, int]]:
    """A stderr handler on each of ``LOGGERS`` while the server runs (removed by ``_unlog``)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("graphtop: %(asctime)s %(levelname)s %(message)s", "%Y-%m-%d %H:%M:%S"))
    added = []
    for name in LOGGERS:
        logger = logging.getLogger(name)
        added.append((logger, handler, logger.level))
        logger.addHandler(handler)
        if name.startswith("graphtop."):
            logger.setLevel(logging.INFO)
    return added


def _unlog(added: list[tuple[logging.Logger, logging.Handler, int]]) -> None:
    for logger, handler, level in added:
        logger.removeHandler(handler)
        logger.setLevel(level)
