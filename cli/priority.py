"""How a viewer process yields the CPU to the engine it watches (``--priority idle``, the default of
``graphtop web`` and ``graphtop attach``).

Why: a viewer is a Python process drawing a Textual screen (and, for a browser tab, a web server relaying
it). On a machine whose cores are all busy, every millisecond it runs is one the engine's host thread
waits for, and each decode step waits for that thread. At idle priority a viewer runs only on CPU time
the engine and everything else leave over; where cores are free it runs as fast as ever.

Two things make a process yield, and either may be what counts on a given machine:

- **Its scheduling policy**: Linux's ``SCHED_IDLE`` (else nice 19), for every thread of the process and
  everything it starts later. This ranks it against the processes of its own scheduling group.
- **Its session's group**: with the kernel's autogroup on (``/proc/sys/kernel/sched_autogroup_enabled``,
  the default of most distributions), the CPU is first split evenly between *sessions* (a terminal, a
  service), and only then between the processes of each. A viewer in a session of its own gets as much
  as the engine's whole session, whatever its policy, unless its group's nice is raised as well. That
  is done only for a process that leads its session (the group then holds nothing but this process and
  its children): never for a terminal's session, which holds the user's shell and what it starts next.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PRIORITIES = ("idle", "normal")
DEFAULT_PRIORITY = "idle"
ENV = "GRAPHTOP_VIEWER_PRIORITY"
"""Where set (idle or normal), the default of ``--priority`` and of ``graphtop serve --dashboard``'s tabs:
a machine whose cores other work keeps busy (a test run beside a CPU load, say) can keep every viewer at
normal priority without a flag on each command."""
LOWEST_NICE = 19
AUTOGROUP = Path("/proc/self/autogroup")
PRIORITY_HELP = "idle (default): run only on CPU time the engine leaves over (Linux SCHED_IDLE); normal: as any process"


def default_priority() -> str:
    """``--priority``'s default: ``$GRAPHTOP_VIEWER_PRIORITY`` where set, else idle (UsageError, one line,
    for a value that is neither)."""
    value = os.environ.get(ENV, "").strip()
    if not value:
        return DEFAULT_PRIORITY
    if value not in PRIORITIES:
        from .usage import UsageError

        raise UsageError(f"{ENV}={value!r}: use one of {', '.join(PRIORITIES)}")
    return value


@dataclass(frozen=True)
class Lowered:
    """What ``lower_priority`` could do: the policy now in force ("SCHED_IDLE", "nice 19" or "unchanged"),
    and whether this process's session group was lowered too."""

    policy: str
    session_group: bool


def lower_priority(own_session: bool = False) -> Lowered:
    """Run this process (all its threads, and what it starts from now on) at the lowest CPU priority.

    ``own_session``: move into a session of its own first (only for a process with no terminal: it leaves
    the terminal's job control), so that its session group can be lowered too. Never raises: a system
    that refuses leaves the process as it was, and the result says so."""
    if own_session:
        try:
            os.setsid()
        except OSError:
            pass  # it leads a process group already (or its session): it stays where it is
    policy = _idle_policy() or _nice_lowest() or "unchanged"
    return Lowered(policy, own_session and _lower_session_group())


def _threads() -> list[int]:
    try:
        return [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def _idle_policy() -> str:
    """SCHED_IDLE for every thread (Linux sets a policy per thread; threads made later inherit it)."""
    if not hasattr(os, "SCHED_IDLE"):
        return ""
    try:
        for tid in _threads():
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
    except OSError:
        return ""
    return "SCHED_IDLE"


def _nice_lowest() -> str:
    try:
        for tid in _threads():  # Linux's nice is per thread too
            os.setpriority(os.PRIO_PROCESS, tid, LOWEST_NICE)
    except OSError:
        return ""
    return f"nice {LOWEST_NICE}"


def _lower_session_group() -> bool:
    """The autogroup's nice to the lowest, for a process that leads its session (else nothing)."""
    if os.getsid(0) != os.getpid():
        return False
    try:
        AUTOGROUP.write_text(str(LOWEST_NICE))
    except OSError:  # no autogroup in this kernel, or not allowed
        return False
    return True


def apply(priority: str, own_session: bool = False) -> Lowered:
    """``--priority``'s value applied: "idle" lowers this process, "normal" leaves it."""
    if priority not in PRIORITIES:
        raise ValueError(f"priority {priority!r}: use one of {', '.join(PRIORITIES)}")
    if priority == "normal":
        return Lowered("unchanged", False)
    return lower_priority(own_session)


def policy_of(pid: int) -> str:
    """The scheduling policy of ``pid``'s main thread, by name ("SCHED_IDLE", "SCHED_OTHER", ...)."""
    value = os.sched_getscheduler(pid)
    names = {getattr(os, n): n for n in ("SCHED_OTHER", "SCHED_BATCH", "SCHED_IDLE", "SCHED_FIFO", "SCHED_RR")}
    return names.get(value, str(value))
