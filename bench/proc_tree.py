"""The processes a viewer is made of, and the CPU time they take (Linux ``/proc``).

Why: a viewer of a busy engine is several processes (a browser tab is a web server, the tab's Textual app,
and Chromium with its own children), and on a machine without a spare core each CPU second they take is
one the engine may not get. A benchmark that reports only the engine's throughput cannot say which of
them cost it; this module counts each one's CPU seconds over a round.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

PROC = Path("/proc")
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcStat:
    """One process as /proc/PID/stat has it: its parent, session, name and CPU seconds (user + system)."""

    pid: int
    ppid: int
    sid: int
    name: str
    cpu_s: float


def stat(pid: int) -> ProcStat | None:
    """``pid``'s stat, or None once it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    name = text[text.index("(") + 1 : text.rindex(")")]
    f = text[text.rindex(")") + 2 :].split()
    return ProcStat(pid, int(f[1]), int(f[3]), name, (int(f[11]) + int(f[12])) * TICK_S)


def thread_cpu_s(tid: int) -> float:
    """CPU seconds a thread of this process has run (``/proc/self/task/TID/schedstat``, in nanoseconds)."""
    try:
        return int((PROC / "self" / "task" / str(tid) / "schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def all_stats() -> list[ProcStat]:
    return [s for s in (stat(int(p.name)) for p in PROC.iterdir() if p.name.isdigit()) if s is not None]


def tree(roots: Iterable[int]) -> list[ProcStat]:
    """``roots`` and all their descendants now alive."""
    stats = all_stats()
    children: dict[int, list[ProcStat]] = {}
    for s in stats:
        children.setdefault(s.ppid, []).append(s)
    by_pid = {s.pid: s for s in stats}
    out: list[ProcStat] = []
    todo = [by_pid[r] for r in roots if r in by_pid]
    while todo:
        s = todo.pop()
        out.append(s)
        todo += children.get(s.pid, [])
    return out


def cpu_by_pid(roots: Iterable[int]) -> dict[int, ProcStat]:
    return {s.pid: s for s in tree(roots)}


def cpu_taken(before: dict[int, ProcStat], after: dict[int, ProcStat]) -> float:
    """CPU seconds the processes of ``after`` took since ``before`` (all of it for one started since)."""
    return sum(s.cpu_s - (before[s.pid].cpu_s if s.pid in before else 0.0) for s in after.values())


def role(pid: int) -> str:
    """What a viewer's process is, from its command line (for the CPU table's rows)."""
    try:
        argv = (PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return "gone"
    words = [a.decode(errors="replace") for a in argv]
    line = " ".join(words)
    if "chrom" in line:
        return "chromium"
    if "playwright" in line or "--browser-tab http" in line:
        return "playwright"
    if "attach" in words and "--browser-tab" in words:
        return "tab app"
    if "web" in words:
        return "graphtop web"
    if "--viewer" in words:
        return "attach viewer"
    return words[0].rsplit("/", 1)[-1] if words else "?"


def cpu_by_role(before: dict[int, ProcStat], after: dict[int, ProcStat]) -> dict[str, float]:
    """``cpu_taken`` split by ``role``."""
    out: dict[str, float] = {}
    for s in after.values():
        r = role(s.pid)
        out[r] = out.get(r, 0.0) + s.cpu_s - (before[s.pid].cpu_s if s.pid in before else 0.0)
    return out


def lower(roots: Iterable[int]) -> None:
    """Every thread of the tree at SCHED_IDLE, and the session groups it leads at the lowest nice: what
    ``graphtop.cli.priority`` does to its own process, done from outside (for a browser that stands for one
    on another machine, lowered once it has loaded the page)."""
    for s in tree(roots):
        try:
            for tid in os.listdir(PROC / str(s.pid) / "task"):
                os.sched_setscheduler(int(tid), os.SCHED_IDLE, os.sched_param(0))
            if s.sid == s.pid:
                (PROC / str(s.pid) / "autogroup").write_text("19")
        except OSError:
            pass  # gone meanwhile, or no autogroup here
