"""Who may open the browser dashboard: the token rule of ``graphtop web`` and ``graphtop serve --dashboard``.

A browser tab can do what ``graphtop attach`` does (send prompts, recapture), so a dashboard that other
machines can reach must not be open to all of them. The rule:

- on a loopback address with no key given, no token: only this machine reaches it, as with the API;
- with a key (``--api-key``, ``$GRAPHTOP_API_KEY``), that key, as the API asks for it;
- on any other address without a key, a token made at start and printed once, in the URL to open.

The token is read from the page's URL (``?token=``), from ``Authorization: Bearer`` (scripts, curl), or
from the websocket's path (``/ws/TOKEN``: the page puts it there; textual-serve's script appends its own
query to the websocket URL, so a query token there would be mangled). Compared in constant time. A
request without it gets 401 before anything else happens, so no dashboard process is started for it.

Two browser-side attacks are closed too: a web page of another site that opens a websocket to this
server (its ``Origin`` must be this server), and DNS rebinding onto a tokenless loopback dashboard (its
``Host`` must then be a loopback name).
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from typing import Mapping, Optional
from urllib.parse import urlsplit

from graphtop.server.options import is_loopback

TOKEN_BYTES = 24
"""Random bytes of a printed token (``secrets.token_urlsafe``): 32 URL-safe characters."""


@dataclass(frozen=True)
class WebAccess:
    """``token``: what a request must carry (None: nothing, a loopback dashboard without a key).
    ``printed``: the token was made here and must be shown once, in the URL to open."""

    token: Optional[str] = None
    printed: bool = False

    @classmethod
    def for_address(cls, host: str, key: Optional[str]) -> "WebAccess":
        """The rule above for a dashboard on ``host``; ``key``: the server's API key, if any."""
        if key:
            return cls(key)
        if is_loopback(host):
            return cls()
        return cls(secrets.token_urlsafe(TOKEN_BYTES), printed=True)

    def allows(self, given: Optional[str]) -> bool:
        """Whether ``given`` is the token (always, when none is needed); constant time."""
        if self.token is None:
            return True
        if not given:
            return False
        return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), self.token.encode("utf-8"))

    def token_of(self, headers: Mapping[str, str], query: Mapping[str, str], path_token: Optional[str] = None) -> str:
        """The token a request carries: its path's, its query's or its bearer header's ("" if none)."""
        if path_token:
            return path_token
        if query.get("token"):
            return query["token"]
        scheme, _, value = headers.get("Authorization", "").partition(" ")
        return value.strip() if scheme.lower() == "bearer" else ""


def origin_problem(headers: Mapping[str, str], needs_token: bool) -> Optional[str]:
    """Why a request's ``Origin``/``Host`` is refused (another site's page, DNS rebinding), or None."""
    host = headers.get("Host", "")
    origin = headers.get("Origin")
    if origin is not None and urlsplit(origin).netloc.lower() != host.lower():
        return f"a page of {origin} may not open this dashboard"
    if not needs_token:
        name = urlsplit(f"//{host}").hostname or ""
        if not is_loopback(name):
            return f"this dashboard answers to this machine only (Host {host or 'missing'})"
    return None
