"""Entry points the CLI calls. Textual is imported inside the functions, never at module import,
so ``graphtop.tui.cli`` can import this module for free in headless runs."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Optional


def run_interactive(
    model_path: Optional[str],
    engine_config: Any = None,
    theme: Optional[str] = None,
    device_label: Optional[str] = None,
    *,
    poll_device: bool = True,
    session: Any = None,
) -> int:
    """Open the dashboard on a live engine (loaded in the background). Returns an exit code.

    ``device_label`` only decorates the label shown while the model loads (the engine's own
    EngineStarted event then names the device). ``session`` lets callers pass a prepared session
    (e.g. ``FakeSession`` for a UI demo without a model).
    """
    from .app import GraphtopApp
    from .session import EngineSession

    if session is None:
        session = EngineSession(model_path, engine_config)
        if device_label:
            session.label = f"{session.label} on {device_label}"
    try:
        app = GraphtopApp(session, theme_name=theme, poll_device=poll_device)
    except ValueError as exc:  # unknown theme
        print(f"graphtop: {exc}", file=sys.stderr)
        return 2
    try:
        app.run()
    finally:
        session.shutdown()
    if app.engine_error:
        print(f"graphtop: engine failed to start: {app.engine_error}", file=sys.stderr)
        return 1
    code = app.return_code or 0
    if _loader_running():
        # Quit while the model was still loading or capturing: the loader is a daemon thread
        # inside torch, and interpreter shutdown ends such a thread mid-C++ (std::terminate,
        # "Aborted", exit 134). The app has restored the terminal; nothing else needs tearing down.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _loader_running() -> bool:
    """Whether the app's model-load thread (``graphtop-engine-load``) is still at work."""
    return any(t.name == "graphtop-engine-load" and t.is_alive() for t in threading.enumerate())


def run_replay(trace_path: str, theme: Optional[str] = None) -> int:
    """Open a recorded trace in the dashboard with pause and seek. Returns an exit code."""
    from graphtop.engine.telemetry.trace import TraceError

    from .app import GraphtopApp
    from .replay_session import ReplaySession

    try:
        session = ReplaySession.from_path(trace_path)
    except TraceError as exc:
        print(f"graphtop: error: {exc}", file=sys.stderr)
        return 2
    try:
        app = GraphtopApp(session, theme_name=theme)
    except ValueError as exc:
        print(f"graphtop: {exc}", file=sys.stderr)
        return 2
    app.run()
    return app.return_code or 0
