"""Is the process an endpoint entry names still the engine that wrote it?

``kill(pid, 0)`` alone says yes for a zombie (an engine that exited but whose parent has not reaped
it) and for an unrelated process that got the pid after the engine died, so ``graphtop ps`` listed
dead engines and ``graphtop attach`` tried them. On Linux ``/proc/<pid>/stat`` tells both apart: the
state ``Z`` is a zombie, and a start time after the entry's ``started`` is a reused pid. Where there
is no ``/proc`` (macOS) only ``kill`` is asked.
"""

from __future__ import annotations

import os
from typing import Optional

START_TOLERANCE_S = 60.0
"""A process that started up to this long after the entry's time is still the one that wrote it: boot
time is whole seconds, and a wall-clock step (NTP, a VM's clock sync) after the entry was written moves
the computed start time but not the entry's. A reused pid comes only after the pid space wraps, so a
wide margin misses none in practice, while too narrow a one would prune a live engine's entry."""


def _boot_time(proc: str) -> Optional[float]:
    try:
        with open(f"{proc}/stat", encoding="ascii") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _stat_fields(pid: int, proc: str) -> Optional[list[str]]:
    """The fields of ``/proc/<pid>/stat`` after the command name (which may hold spaces and ``)``):
    [0] is the state, [19] the start time in clock ticks since boot. None where it cannot be read."""
    try:
        with open(f"{proc}/{pid}/stat", encoding="ascii", errors="replace") as f:
            text = f.read()
    except FileNotFoundError:
        return []  # /proc is there but the process is not
    except OSError:
        return None
    return text.rpartition(")")[2].split()


def process_alive(pid: int, started: float, proc: str = "/proc") -> bool:
    """True when ``pid`` runs and is not a zombie, nor a process that started after ``started`` (epoch
    seconds, the entry's time). Falls back to ``kill(pid, 0)`` without a readable ``/proc``."""
    fields = _stat_fields(pid, proc) if os.path.isdir(f"{proc}/self") else None
    if fields is None:
        return _kill_alive(pid)
    if not fields or fields[0] in ("Z", "X"):
        return False
    boot = _boot_time(proc)
    if boot is None or len(fields) < 20 or not fields[19].isdigit():
        return _kill_alive(pid)
    began = boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    return began <= started + START_TOLERANCE_S


def _kill_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    return True
