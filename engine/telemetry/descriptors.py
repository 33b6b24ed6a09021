"""Room for the telemetry endpoint's connections in the process's file descriptor limit.

Why: each attached viewer and each connection in its handshake holds a descriptor of the engine's
process. Many systems start processes with a soft limit of 1024 (and a far higher hard one), so a
thousand viewers would leave the engine unable to open a file, and ZeroMQ's listener would spin on
``EMFILE``. Raising the soft limit up to the hard one is what a process may always do, and what Go's
runtime does for every program; it is never lowered here.
"""

from __future__ import annotations

import logging

log = logging.getLogger("graphtop.telemetry")

SPARE = 256
"""Descriptors kept for everything else of the engine's process (files, the device, pipes)."""


def make_room_for(connections: int) -> int:
    """Raise the soft ``RLIMIT_NOFILE`` so that ``connections`` more fit beside ``SPARE`` others, up to
    the hard limit; returns the soft limit now (-1 where the platform has none)."""
    try:
        import resource
    except ImportError:  # not POSIX: nothing to raise
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + SPARE
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return soft
    new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if new <= soft:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    except (ValueError, OSError) as exc:
        log.warning("could not raise the open-file limit from %d to %d: %s", soft, new, exc)
        return soft
    return new
