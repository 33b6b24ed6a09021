"""Graph parity: are the graphs computing what the eager path computes? (``--parity-every N``)

Shown once checks are switched on (command line or palette) or seen in a replayed trace: checks run,
mismatches, the worst relative error against its tolerance, argmax agreement and top-5 overlap, and
how many due checks were skipped (one still running) or discarded (its requests' KV was freed
midway). Any mismatch turns the panel red (``-mismatch``, styled with theme variables): a graph that
disagrees with eager execution is serving wrong tokens.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.content import Content
from textual.widgets import Static

from ..fmt import ms, pct
from ..state import DashboardState
from .panel import Panel, set_content


class ParityPanel(Panel):
    AREAS = ("parity",)
    TITLE = "graph parity"
    MIN_INTERVAL = 0.5

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.wanted = False  # until checks are switched on or seen

    def compose(self) -> ComposeResult:
        yield Static(id="parity-body")

    def render_state(self, state: DashboardState) -> None:
        p = state.parity
        every = state.parity_every
        self.want(bool(every or p.checks))
        self.set_class(p.failing, "-mismatch")
        body = self.query_one("#parity-body", Static)
        rate = f"1 in {every}" if every else "off"
        if not p.checks:
            waiting = Content.from_markup("$r · [$text-muted]waiting for the first check[/]", r=rate)
            if p.skipped or p.discarded:  # due checks that compared nothing (parity_not_run events)
                waiting = Content("\n").join(
                    [
                        waiting,
                        Content.from_markup(
                            "[$text-muted]skipped $s · discarded $d[/]", s=f"{p.skipped:,}", d=f"{p.discarded:,}"
                        ),
                    ]
                )
            set_content(body, waiting)
            return
        verdict = "[$error b]$m mismatch(es)[/]" if p.failing else "[$success]all agree[/]"
        last = state.parity_last
        lines = [
            Content.from_markup(
                f"$r · [b]$n[/b] checks · {verdict} · skipped $s",
                r=rate,
                n=f"{p.checks:,}",
                m=f"{p.mismatches:,}",
                s=f"{p.skipped:,}",
            ),
            Content.from_markup(
                "worst rel err [b]$e[/b] [$text-muted](tol $t)[/] · argmax $a",
                e=f"{p.worst_rel_err:.2g}",
                t=f"{p.tolerance:g}",
                a=pct(p.min_argmax_agree),
            ),
            Content.from_markup(
                "[$text-muted]top-5 $o · discarded $d · last step $st ($ms ms)[/]",
                o=pct(p.min_top5_overlap),
                d=f"{p.discarded:,}",
                st=str(last.step) if last else "—",
                ms=ms(last.check_ms) if last else "—",
            ),
        ]
        set_content(body, Content("\n").join(lines))
