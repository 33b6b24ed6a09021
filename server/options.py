"""What a server is told: where to listen, who may call it, how many requests may wait, how long a
connection may take, and how long a shutdown waits for the requests in flight."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Optional

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_MAX_QUEUED = 1024
DEFAULT_KEEP_ALIVE_S = 5.0
"""uvicorn's default (and vLLM's): an idle keep-alive connection is closed after this long."""
DEFAULT_HEADER_TIMEOUT_S = 10.0
"""A connection must finish a request's headers this long after it opened (or after its last response)."""
DEFAULT_SHUTDOWN_TIMEOUT_S = 5.0
"""On SIGTERM, requests in flight get this long to finish before their streams are ended."""


@dataclass(frozen=True)
class ServeOptions:
    """``max_queued_requests``: requests that may wait for a running slot beyond the engine's running
    batch (None: no bound); past it a request gets 429. ``api_key``: clients must send
    ``Authorization: Bearer KEY`` to ``/v1/*`` (``/health`` and ``/metrics`` stay open, as in vLLM).
    ``model_name``: the id ``/v1/models`` lists first, that responses report, and that requests may name
    (or leave out); ``model_aliases``: more names requests may give, listed after it (vLLM's
    ``--served-model-name A B``); ``model_root``: the model as given, ``root`` in ``/v1/models`` (vLLM's
    benchmark takes its tokenizer from there when it is given none). ``seed``: the
    sampling seed of requests that give none. ``log_requests``: a line per request on the
    ``graphtop.serve`` logger. ``timeout_keep_alive``, ``timeout_headers``, ``max_connections``: the
    connection limits of ``connections``; ``shutdown_timeout``: how long a shutdown waits for requests."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api_key: Optional[str] = None
    max_queued_requests: Optional[int] = DEFAULT_MAX_QUEUED
    model_name: str = "graphtop"
    model_aliases: tuple[str, ...] = ()
    model_root: Optional[str] = None
    seed: Optional[int] = None
    log_requests: bool = True
    timeout_keep_alive: float = DEFAULT_KEEP_ALIVE_S
    timeout_headers: float = DEFAULT_HEADER_TIMEOUT_S
    max_connections: Optional[int] = None
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S

    def __post_init__(self) -> None:
        if not isinstance(self.port, int) or isinstance(self.port, bool) or not 0 <= self.port <= 65535:
            raise ValueError(f"port must be an integer in 0..65535, got {self.port!r}")
        if self.max_queued_requests is not None and self.max_queued_requests < 0:
            raise ValueError(f"max_queued_requests must be >= 0, got {self.max_queued_requests}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("the API key is empty")
        names = self.served_names
        if not all(names):
            raise ValueError("a served model name is empty")
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"the served model name {twice[0]!r} is given twice")
        for name in ("timeout_keep_alive", "timeout_headers", "shutdown_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e6:
                raise ValueError(f"{name} must be a number of seconds in [0, 1e6), got {value!r}")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")

    @property
    def served_names(self) -> tuple[str, ...]:
        """Every name requests may give, the reported one first."""
        return (self.model_name, *self.model_aliases)


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach ``host`` (an empty host or a wildcard reaches every interface)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_warning(options: ServeOptions) -> Optional[str]:
    """The warning for a server other machines can reach with no API key, or None."""
    if options.api_key is None and not is_loopback(options.host):
        return (
            f"serving on {options.host} without --api-key: anyone who can reach this machine can use the "
            "model (pass --api-key KEY, or bind to 127.0.0.1)"
        )
    return None


def model_name_for(model: Optional[str]) -> str:
    """The served model id: the checkpoint's folder or file name, or ``demo`` for the demo model."""
    if model is None:
        return "demo"
    name = model.rstrip("/").rsplit("/", 1)[-1]
    return name or model
