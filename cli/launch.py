"""Entry points the CLI calls. Textual is imported inside the functions, never at module import,
so ``graphtop.cli.entry`` can import this module for free in headless runs.

``graphtop --model PATH`` is two processes that look like one: this process serves the engine on a
telemetry endpoint and loads it, while a child process (``graphtop attach --owner PID``) draws the
dashboard on this terminal. Rendering then never competes with the engine thread for a GIL, and
``q`` in the child ends both: the child exits and this process shuts the engine down.
"""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import threading
from typing import Any, Optional

from .usage import UsageError, print_error


def terminal_problem() -> Optional[str]:
    """Why the dashboard cannot run here, or None. It reads keys from stdin and draws on stdout: with
    either redirected, Textual's input thread spins on a closed or piped stdin and keeps the process
    alive past SIGTERM, so such a run is refused up front."""
    names = [name for name, stream in (("stdin", sys.stdin), ("stdout", sys.stdout)) if not _is_tty(stream)]
    if not names:
        return None
    return (
        f"the dashboard needs a terminal, but {' and '.join(names)} {'is' if len(names) == 1 else 'are'} "
        "not one (for a run without a terminal use --prompts/--synthetic with --output/--record)"
    )


def _is_tty(stream: Any) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (ValueError, OSError):  # a closed stream
        return False


def run_interactive(
    model_path: Optional[str],
    engine_config: Any = None,
    theme: Optional[str] = None,
    device_label: Optional[str] = None,
    *,
    poll_device: bool = True,
    session: Any = None,
    telemetry: str = "ipc",
    serve: Any = None,
) -> int:
    """Serve a live engine (loaded in the background) and open the dashboard on it in a child
    process. Returns an exit code.

    ``serve``: ``ServeOptions`` of an OpenAI-compatible API to serve beside the dashboard once the
    engine runs (``--serve``); its socket is bound here, before the dashboard starts, so a port in use
    is a one-line error.

    ``device_label`` only decorates the label shown while the model loads (the engine's own
    EngineStarted event then names the device). ``session`` runs the dashboard in this process on a
    prepared session instead (e.g. ``FakeSession`` for a UI demo without a model).
    """
    if session is not None:
        return run_app(session, theme, poll_device=poll_device)
    problem = terminal_problem()
    if problem:  # before a model is loaded for nothing
        raise UsageError(problem)
    from graphtop.engine.telemetry.bus import EventBus

    from .endpoint import TOKEN_ENV, open_endpoint

    api = _ApiBeside(serve) if serve is not None else None
    label = model_path or "demo model"
    if device_label:
        label = f"{label} on {device_label}"
    bus = EventBus()
    # the child takes the terminal at once: only a TCP endpoint's token is worth saying first
    server = open_endpoint(bus, telemetry, label, say_where=telemetry.startswith("tcp://"))
    argv = [sys.executable, "-m", "graphtop.cli.entry", "attach", server.endpoint, "--owner", str(os.getpid())]
    argv += ["--priority", "normal"]  # the dashboard of one's own run is what the user came for (docs/attach.md)
    if theme:
        argv += ["--theme", theme]
    if not poll_device:
        argv.append("--no-device-poll")
    child = subprocess.Popen(argv, env={**os.environ, TOKEN_ENV: server.token})
    holder: dict[str, Any] = {}
    if api is not None:
        api.subscribe(bus)
    loader = threading.Thread(
        target=_load_engine,
        args=(model_path, engine_config, bus, server, holder, api),
        name="graphtop-engine-load",
        daemon=True,
    )
    with _QuietTerminal():
        loader.start()
        try:
            code = child.wait()
        except KeyboardInterrupt:
            child.terminate()
            code = child.wait()
    code = 128 - code if code < 0 else code  # killed by a signal: the shell's convention
    if loader.is_alive():
        # Quit while the model was still loading or capturing: the loader is a daemon thread
        # inside torch, and interpreter shutdown ends such a thread mid-C++ (std::terminate,
        # "Aborted", exit 134). The child has restored the terminal; nothing else needs tearing down.
        server.close("graphtop is quitting")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if api is not None:
        api.close()
    engine = holder.get("engine")
    if engine is not None:
        engine.shutdown()
    server.close("graphtop is quitting")
    return code


class _ApiBeside:
    """The dashboard's ``--serve``: the socket bound now, metrics subscribed before the engine exists (so
    they count its capture), the server started once the engine serves."""

    def __init__(self, options: Any) -> None:
        from .serve import bind, warn_if_exposed

        self.options = options
        self.sock = bind(options)
        warn_if_exposed(options)
        self.metrics: Any = None
        self.server: Any = None

    def subscribe(self, bus: Any) -> None:
        from graphtop.engine.telemetry.metrics import MetricsCollector

        self.metrics = MetricsCollector(bus)

    def start(self, engine: Any) -> None:
        from graphtop.server.server import ApiServer

        self.server = ApiServer(engine, self.options, metrics=self.metrics, sock=self.sock).start()
        logging.getLogger("graphtop").info("serving the OpenAI API at %s/v1", self.server.url)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        if self.metrics is not None:
            self.metrics.close()
        self.sock.close()


def _load_engine(
    model_path: Optional[str],
    config: Any,
    bus: Any,
    server: Any,
    holder: dict[str, Any],
    api: Optional[_ApiBeside] = None,
) -> None:
    """Load, serve, start: the viewer child watches the load and capture through the endpoint."""
    try:
        from graphtop.engine import Engine, EngineConfig

        engine = Engine.from_pretrained(model_path, config=config if config is not None else EngineConfig(), bus=bus)
    except BaseException as exc:  # everything is reported to the viewer, which stays up to show it
        server.engine_failed(f"{type(exc).__name__}: {exc}")
        return
    holder["engine"] = engine
    engine.serve_telemetry(server=server)
    engine.start_background()
    if api is not None:
        try:
            api.start(engine)
        except Exception as exc:  # the dashboard still shows the engine; the log says why there is no API
            logging.getLogger("graphtop").error("the OpenAI API could not start: %s", exc)


class _QuietTerminal:
    """While the child draws on the terminal, this process writes nothing to it: engine log records
    reach the viewer through the endpoint instead, and stray prints go to a bounded buffer."""

    def __enter__(self) -> "_QuietTerminal":
        self._logger = logging.getLogger("graphtop")
        self._propagate = self._logger.propagate
        self._logger.propagate = False
        self._streams = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = _Tail()
        return self

    def __exit__(self, *exc: object) -> None:
        sys.stdout, sys.stderr = self._streams
        self._logger.propagate = self._propagate


class _Tail(io.TextIOBase):
    """A text sink that keeps only its last ``limit`` characters."""

    def __init__(self, limit: int = 1 << 16) -> None:
        self.limit = limit
        self.text = ""

    def write(self, s: str) -> int:
        self.text = (self.text + s)[-self.limit :]
        return len(s)

    def writable(self) -> bool:
        return True


def run_app(
    session: Any,
    theme: Optional[str] = None,
    *,
    poll_device: bool = True,
    exit_when_engine_ends: bool = False,
    browser_tab: bool = False,
) -> int:
    """Run the dashboard on ``session`` in this process until it quits. Returns an exit code.

    ``browser_tab``: drawn for a browser by textual-serve (its web driver speaks over pipes, so there is
    no terminal to ask for), and with no file actions on this host."""
    from graphtop.tui.app import GraphtopApp

    try:
        app = GraphtopApp(
            session, theme_name=theme, poll_device=poll_device, exit_when_engine_ends=exit_when_engine_ends
        )
    except ValueError as exc:  # unknown theme
        session.shutdown()
        print_error(str(exc))
        return 2
    app.host_files = not browser_tab
    problem = None if browser_tab else terminal_problem()
    if problem:
        session.shutdown()
        print_error(problem)
        return 2
    try:
        app.run()
    finally:
        session.shutdown()
    if app.engine_error:
        print_error(f"engine failed to start: {app.engine_error}")
        return 1
    code = app.return_code or 0
    if _loader_running():
        # Quit while an in-process model load was still running (see run_interactive).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _loader_running() -> bool:
    """Whether the app's model-load thread (``graphtop-engine-load``) is still at work."""
    return any(t.name == "graphtop-engine-load" and t.is_alive() for t in threading.enumerate())


def run_replay(trace_path: str, theme: Optional[str] = None) -> int:
    """Open a recorded trace in the dashboard with pause and seek. Returns an exit code."""
    from graphtop.engine.trace_tools.trace import TraceError
    from graphtop.tui.sessions.replay import ReplaySession

    try:
        session = ReplaySession.from_path(trace_path)
    except TraceError as exc:
        print_error(str(exc))
        return 2
    return run_app(session, theme)
