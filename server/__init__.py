"""graphtop.server: the OpenAI-compatible HTTP API (FastAPI + uvicorn) with Prometheus metrics.

``ApiServer(engine, ServeOptions(...)).start()`` serves an engine that runs on its background thread;
``graphtop serve`` and the dashboard's ``--serve`` build one. The engine never imports this package.
Names resolve lazily (PEP 562): the command line reads ``options`` without importing FastAPI.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "ApiServer": ".server",
    "ServeError": ".server",
    "listen": ".server",
    "ServeOptions": ".options",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'graphtop.server' has no attribute {name!r}")
    return getattr(import_module(module, __name__), name)
