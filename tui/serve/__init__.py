"""graphtop.tui.serve: the OpenAI-compatible HTTP API (FastAPI + uvicorn) with Prometheus metrics.

``ApiServer(engine, ServeOptions(...)).start()`` serves an engine that runs on its background thread;
``graphtop serve`` and the dashboard's ``--serve`` build one. The engine never imports this package.
"""

from .options import ServeOptions
from .server import ApiServer, ServeError, listen

__all__ = ["ApiServer", "ServeError", "ServeOptions", "listen"]
