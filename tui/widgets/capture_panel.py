"""Model load and graph capture, live: per phase, per bucket, with time and memory.

Capture is where a graph engine spends its startup and its memory; watching it bucket by bucket
tells you at once which bucket is slow or expensive, and which one failed and why. The engine serves
while it captures, and the panel says so: how many buckets are live, and that the others' steps run
eagerly until theirs is.
"""

from __future__ import annotations

from typing import Optional

from textual.app import ComposeResult
from textual.content import Content
from textual.widgets import Static

from graphtop.engine.telemetry.capture import CapturePass

from ..fmt import bar, human_bytes, secs
from ..state import DashboardState
from .panel import Panel, set_content

RECENT = 4
"""Buckets listed under a phase while it captures (the modal table has all of them)."""


def capture_work(cap: CapturePass) -> float:
    """Seconds spent capturing the pass's buckets (what an estimate predicts; a recapture's wall time
    is longer, as it runs in slices between steps)."""
    return sum(c.seconds for c in cap.costs)


def phase_line(cap: CapturePass) -> Content:
    """``decode  ████░░ 4/6 0.31s 48.0 MiB`` with a ✓/✗/… mark (backends are in the status line)."""
    done = len(cap.costs)
    total = cap.total or done
    frac = done / total if total else 0.0
    if cap.finished is not None:
        mark = "[$success]✓[/]" if cap.finished.ok and not cap.failed else "[$error]✗[/]"
    else:
        mark = "[$warning]…[/]"
    return Content.from_markup(
        f"[b]$phase[/b] [$primary]$bar[/] $done/$total $secs $mem {mark}",
        phase=f"{cap.phase:<7}",
        bar=bar(frac, 12),
        done=str(done),
        total=str(total),
        secs=secs(capture_work(cap)),
        mem=human_bytes(cap.memory_bytes),
    )


class CapturePanel(Panel):
    """Loading state, then one progress line per phase and the buckets captured most recently."""

    AREAS = ("info", "capture")
    TITLE = "graph capture"
    MIN_INTERVAL = 0.1  # capture progress can arrive in bursts; 10 Hz is smooth enough

    def __init__(self, label: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.session_label = label

    def compose(self) -> ComposeResult:
        yield Static(id="capture-body")

    def render_state(self, state: DashboardState) -> None:
        lines: list[Content] = []
        if state.failed:
            lines.append(Content.from_markup("[$error]engine failed:[/] $e", e=state.failed))
        elif state.info is None:
            lines.append(Content.from_markup("[$warning]●[/] loading $m…", m=self.session_label))
            lines.extend(load_lines(state))
            lines.append(Content.from_markup("[$text-muted]prompts typed now run once it is loaded[/]"))
        for phase in ("decode", "prefill"):
            cap = state.capture.get(phase)
            if cap is None:
                continue
            lines.append(phase_line(cap))
            if cap.finished is not None and (cap.finished.kernels_compiled or cap.finished.kernels_cached):
                lines.append(
                    Content.from_markup(
                        "  [$text-muted]kernels: $c compiled ahead, $d cached[/]",
                        c=str(cap.finished.kernels_compiled),
                        d=str(cap.finished.kernels_cached),
                    )
                )
            if cap.finished is None:
                for c in cap.costs[-RECENT:]:
                    lines.append(
                        Content.from_markup(
                            "  [$text-muted]bucket[/] $b $s $m",
                            b=f"{c.bucket:>6}",
                            s=f"{secs(c.seconds):>6}",
                            m=human_bytes(c.memory_bytes),
                        )
                    )
            if cap.failed:
                failed = ", ".join(f"{b} ({r or 'failed'})" for b, r in sorted(cap.failed.items()))
                lines.append(Content.from_markup("  [$error]failed:[/] $f", f=failed))
        if state.capturing and any(c.reason == "initial" and c.finished is None for c in state.capture.values()):
            live, total = state.buckets_live()
            lines.append(
                Content.from_markup(
                    "[$warning]●[/] serving while capturing: $live/$total buckets live",
                    live=str(live),
                    total=str(total),
                )
            )
            waiting = state.last_fallback == "kernels_compiling"
            reason = "kernels_compiling" if waiting else "not_yet_captured"
            lines.append(Content.from_markup("  [$text-muted]steps of the rest: eager ($r)[/]", r=reason))
        if state.tp_size > 1:
            lines.extend(rank_lines(state))
        lines.extend(recapture_lines(state))
        if state.info is not None and not state.capture:
            if state.graphs_planned:  # started, its first CaptureStarted not folded in yet
                lines.append(Content.from_markup("[$warning]●[/] graph capture starting…"))
            else:
                lines.append(Content.from_markup("[$text-muted]no graphs configured: every step runs eagerly[/]"))
        set_content(self.query_one("#capture-body", Static), Content("\n").join(lines))


def load_lines(state: DashboardState) -> list[Content]:
    """A long load's step (a .gguf's one-time conversion), with a bar where its length is known."""
    ev = state.load_progress
    if ev is None:
        return []
    lines = [Content.from_markup("  $label", label=ev.label)]
    if ev.total:
        lines.append(
            Content.from_markup(
                "  [$primary]$bar[/] $step $done/$total",
                bar=bar(ev.done / ev.total, 12),
                step=ev.step,
                done=str(ev.done),
                total=str(ev.total),
            )
        )
    else:
        lines.append(Content.from_markup("  $step…", step=ev.step))
    return lines


def rank_lines(state: DashboardState) -> list[Content]:
    """Tensor parallel: each worker rank's capture next to rank 0's lines above, then any rank that
    died or failed a bucket, by name."""
    lines: list[Content] = []
    for rank, phases in sorted(state.rank_captures.items()):
        if rank == 0:
            continue
        parts = []
        for phase in ("decode", "prefill"):
            cap = phases.get(phase)
            if cap is not None:
                done = "✓" if cap.finished is not None and not cap.failed else ("✗" if cap.failed else "…")
                parts.append(f"{phase} {len(cap.costs)}/{cap.total or len(cap.costs)} {done}")
        lines.append(Content.from_markup("[$text-muted]rank $r[/] $p", r=str(rank), p="  ".join(parts)))
    for alert in state.rank_alerts():
        lines.append(Content.from_markup("[$error]$a[/]", a=alert))
    return lines


def _est(seconds: Optional[float]) -> str:
    return "est. " + (secs(seconds) if seconds is not None else "unknown")


def recapture_lines(state: DashboardState) -> list[Content]:
    """Where the recapture stands: requested, capturing (work so far against the estimate), or how the
    last one went (capture work beside its estimate, and the wall time)."""
    run = state.recapture.current
    if run is not None and not run.started:
        return [
            Content.from_markup("[$warning]●[/] recapture requested: runs at the next step"),
            Content.from_markup("  [$text-muted]$e capture work[/]", e=_est(run.estimate_s)),
        ]
    if run is not None:
        return [
            Content.from_markup(
                "[$warning]●[/] recapturing $d/$t · $w of $e",
                d=str(run.buckets_done),
                t=str(run.buckets_total),
                w=secs(run.work_s),
                e=_est(run.estimate_s),
            ),
            Content.from_markup("  [$text-muted]serving; eager meanwhile: recapture_in_progress[/]"),
        ]
    last = state.recapture.last
    if last is None or last.finished is None:
        return []
    r = last.finished
    if not r.ok:
        return [
            Content.from_markup("[$error]last recapture failed:[/]"),
            Content.from_markup("  $m", m=r.message or "no reason given"),
        ]
    took = (
        Content.from_markup(
            "  capture $w [$text-muted]($e)[/] · wall $s",
            w=secs(last.work_s),
            e=_est(last.estimate_s),
            s=secs(r.seconds),
        )
        if last.lists
        else Content.from_markup("  wall $s", s=secs(r.seconds))
    )
    return [Content.from_markup("[$success]last recapture ok[/]"), took]
