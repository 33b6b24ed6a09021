"""How a listening address is written in a URL, for the API server and the browser dashboard alike (no
FastAPI here: the command line imports it)."""

from __future__ import annotations


def url_host(host: str) -> str:
    """``host`` as a URL names it: a wildcard address becomes its loopback (where a local client reaches the
    server), an IPv6 address goes in brackets."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host in ("::", "[::]"):
        return "[::1]"
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    return host
