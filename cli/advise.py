"""``graphtop advise TRACE.jsonl``: the bucket lists a recorded workload should have had.

The trace is folded the way the dashboard folds events (``DashboardState``: steps, capture costs,
the prefill padding cap, the lists in use); the advice comes from the bucket advisor
(``graphs.bucket_demand.advise_phase``, the same call the bucket editor makes), and the numbers
shown for both lists come from the what-if (``whatif.what_if``), whose predictions a recapture
reproduces. Budgets apply to each phase: ``--max-graphs`` defaults to the graph count of the trace's
list, so the advice is compared at equal count; memory is unbounded unless ``--max-graph-memory``.
"""

from __future__ import annotations

import argparse
import json
import shlex
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from graphtop.engine.graphs.bucket_demand import DEFAULT_HOLDOUT, MAX_EAGER_RATIO
from graphtop.engine.telemetry.plain_text import one_line

from .flag_types import file_path, finite_float, nonneg_int, parse_size
from .usage import UsageError


def build_advise_parser(parser_class: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    from .help_text import HelpFormatter, document

    p = parser_class(
        prog="graphtop advise",
        formatter_class=HelpFormatter,
        description="Advise CUDA-graph bucket lists for the workload a trace recorded.",
        epilog="example: graphtop advise run.jsonl --max-graphs 8 --max-graph-memory 512MiB",
    )
    p.add_argument(
        "trace", type=file_path, metavar="TRACE.jsonl", help="a trace written by graphtop (--record, or Export trace)"
    )
    p.add_argument(
        "--max-graphs", type=nonneg_int, metavar="N", help="graphs per phase (default: as many as the trace's list has)"
    )
    p.add_argument(
        "--max-graph-memory",
        type=parse_size,
        metavar="SIZE",
        help="estimated graph memory per phase, from the trace's capture ledger (e.g. 512MiB)",
    )
    p.add_argument("--phase", choices=["decode", "prefill", "both"], default="both")
    p.add_argument(
        "--eager-ratio",
        type=finite_float(0.0, MAX_EAGER_RATIO, lo_open=True),
        metavar="R",
        help="eager step time / graph step time (default: measured from the trace, else a default)",
    )
    p.add_argument(
        "--holdout",
        type=finite_float(0.0, 0.9),
        default=DEFAULT_HOLDOUT,
        metavar="F",
        help=f"the later fraction of each phase's steps held out to choose and score the advice on; 0: none"
        f" (default {DEFAULT_HOLDOUT:g})",
    )
    return document(p)


@dataclass
class Advice:
    """What ``graphtop advise`` prints and the trace report draws: per phase, the list in use and the
    advised one, with the what-if's numbers for both (``now``, ``new``)."""

    state: Any  # the DashboardState the trace was folded into
    reports: list[tuple]  # (phase, budget, advice, demand, cost of today's list) per phase advised
    now: Any  # what_if of today's lists
    new: Any  # what_if of the advised lists
    cap: Optional[float]  # the prefill padding cap the advice assumed
    current: dict[str, list[int]] = field(default_factory=dict)
    advised: dict[str, list[int]] = field(default_factory=dict)


def compute_advice(
    trace: Any,
    *,
    max_graphs: Optional[int] = None,
    max_memory: Optional[float] = None,
    phase: str = "both",
    eager_ratio: Optional[float] = None,
    holdout: float = DEFAULT_HOLDOUT,
) -> Advice:
    """Fold ``trace`` as the dashboard does and advise each phase; ValueError (one line) when there is
    nothing to advise from or the advisor refuses its inputs."""
    from graphtop.engine.graphs.bucket_advisor import expected_cost
    from graphtop.engine.graphs.bucket_demand import advise_phase
    from graphtop.tui.state import DashboardState
    from graphtop.tui.whatif import what_if

    state = DashboardState(step_history=None, event_history=0)
    state.apply_all(trace.events)
    inputs = state.whatif_inputs()
    if not inputs.steps:
        raise ValueError("no steps recorded, nothing to advise from")
    phases = ["decode", "prefill"] if phase == "both" else [phase]
    current = {ph: state.current_buckets(ph) for ph in ("decode", "prefill")}
    cap = inputs.max_padding_waste
    advised = dict(current)
    reports = []
    for ph in phases:
        budget = max_graphs if max_graphs is not None else (len(current[ph]) or None)
        advice, demand = advise_phase(
            inputs.steps,
            ph,
            costs=inputs.costs,
            max_padding_waste=cap,
            current=current[ph] or None,
            max_graphs=budget,
            max_memory=max_memory,
            ratio=eager_ratio,
            holdout=holdout,
            page_size=state.kv.page_size if state.kv is not None else None,
        )
        if demand.steps == 0:
            continue
        advised[ph] = list(advice.buckets)
        ph_cap = cap if ph == "prefill" else None
        now_cost = expected_cost(
            ph, demand.sizes, current[ph], eager_ratio=demand.ratio.value, max_padding_waste=ph_cap
        )
        reports.append((ph, budget, advice, demand, now_cost))
    if not reports:
        raise ValueError(f"no {' or '.join(phases)} steps recorded, nothing to advise from")
    both = dict(current_decode=current["decode"], current_prefill=current["prefill"], max_padding_waste=cap)
    now = what_if(inputs.steps, current["decode"], current["prefill"], inputs.costs, **both)
    new = what_if(inputs.steps, advised["decode"], advised["prefill"], inputs.costs, **both)
    return Advice(state, reports, now, new, cap, current, advised)


def run_advise(args: argparse.Namespace) -> int:
    from graphtop.engine.trace_tools.trace import TraceError, read_trace

    try:
        trace = read_trace(args.trace)
    except TraceError as e:
        raise UsageError(str(e)) from None
    try:
        a = compute_advice(
            trace,
            max_graphs=args.max_graphs,
            max_memory=args.max_graph_memory,
            phase=args.phase,
            eager_ratio=args.eager_ratio,
            holdout=args.holdout,
        )
    except ValueError as e:
        raise UsageError(f"{args.trace}: {e}") from None
    report = format_advice(args, trace, a.state, a.reports, a.now, a.new, a.cap)
    print("".join(one_line(line) + "\n" for line in report.splitlines()), end="")  # trace text: no controls
    return 0


def graph_config_json(advised: dict[str, list[int]], cap: Optional[float]) -> str:
    """The ``--cuda-graph-config`` that captures the advised lists (an empty list disables the phase)."""
    out: dict[str, Any] = {}
    if "decode" in advised:
        out["decode"] = {"bs": advised["decode"]} if advised["decode"] else {"backend": "disabled"}
    if "prefill" in advised:
        body: dict[str, Any] = {"num_tokens": advised["prefill"]} if advised["prefill"] else {"backend": "disabled"}
        if advised["prefill"] and cap is not None:
            body["max_padding_waste"] = cap  # the advice assumed this cap
        out["prefill"] = body
    return json.dumps(out, separators=(",", ":"))


def format_advice(
    args: argparse.Namespace, trace: Any, state: Any, reports: Sequence[tuple], now: Any, new: Any, cap: Optional[float]
) -> str:
    from graphtop.engine.graphs.bucket_list import format_buckets
    from graphtop.tui.fmt import human_bytes, pct

    def mem(v: Optional[float]) -> str:
        return "unknown" if v is None else human_bytes(v)

    def rel(cost: float, ideal: float) -> str:
        return f"{cost / ideal:.3f}×" if ideal else "—"

    lines = [f"graphtop advise: {trace.path}"]
    steps = now.decode.steps + now.prefill.steps
    lines.append(
        f"  {steps:,} steps (decode {now.decode.steps:,} · prefill {now.prefill.steps:,})"
        + ("; EMULATED run: graph timings are not real, eager ratios default" if state.emulated else "")
    )
    memory = "unbounded" if args.max_graph_memory is None else human_bytes(args.max_graph_memory)
    lines.append(
        f"  budget per phase: graphs {'as in the trace' if args.max_graphs is None else args.max_graphs}"
        f", graph memory {memory}" + (f"; prefill padding cap {cap:g}" if cap is not None else "")
    )
    advised: dict[str, list[int]] = {}
    for phase, budget, advice, demand, now_cost in reports:
        a, b = getattr(now, phase), getattr(new, phase)
        current = state.current_buckets(phase)
        advised[phase] = list(advice.buckets)
        rows = [
            ("buckets", format_buckets(current) or "(none)", format_buckets(advice.buckets) or "(none)"),
            ("graphs", str(len(current)), str(len(advice.buckets))),
            ("hit rate", pct(a.hit_rate), pct(b.hit_rate)),
            ("padding waste", pct(a.padding_waste), pct(b.padding_waste)),
            ("graph memory (est.)", mem(a.est_memory_bytes), mem(b.est_memory_bytes)),
            ("cost ÷ ideal", rel(now_cost, advice.ideal), rel(advice.cost, advice.ideal)),
        ]
        width = max(12, *(len(r[1]) for r in rows))
        lines.append("")
        lines.append(f"{phase:<24}{'now':<{width + 2}}advice" + (f" (at most {budget} graphs)" if budget else ""))
        for name, x, y in rows:
            lines.append(f"  {name:<22}{x:<{width + 2}}{y}")
        lines.extend(_held_out_lines(advice.held_out, width))
        lines.append(f"  {'eager ÷ graph step':<22}{demand.ratio.value:.2f} ({demand.ratio.source})")
        if advice.bucket_memory:
            per = ", ".join(f"{b}: {human_bytes(m)}" for b, m in zip(advice.buckets, advice.bucket_memory))
            lines.append(f"  {'memory per bucket':<22}{per}")
        if advice.uncovered:
            n = sum(demand.sizes.get(s, 0) for s in advice.uncovered)
            lines.append(
                f"  {n:,} step(s) of {len(advice.uncovered):,} size(s) up to {advice.uncovered[-1]:,} left without "
                f"a bucket: {advice.uncovered_because}"
            )
        if demand.fixed_eager:
            lines.append(f"  {demand.fixed_eager:,} step(s) ran eagerly for reasons no bucket list changes")
    lines.append("")
    lines.append("--cuda-graph-config " + shlex.quote(graph_config_json(advised, cap)))
    return "\n".join(lines) + "\n"


def _held_out_lines(held: Any, width: int) -> list[str]:
    """Train and held-out cost ÷ ideal for the lists in use and the advice, and the grid the held-out
    cost chose; a line that nothing was held out when the trace was too short to split."""
    if held is None:
        return [f"  {'held out':<22}nothing (too few steps, or --holdout 0): the costs above are in-sample"]

    def f(v: Optional[float]) -> str:
        return "—" if v is None else f"{v:.3f}×"

    grids = ", ".join(f"{g}: {c:.3f}×" for g, c in held.by_grid)
    return [
        f"  {'train cost ÷ ideal':<22}{f(held.now_train):<{width + 2}}{f(held.advice_train)}",
        f"  {'held-out cost ÷ ideal':<22}{f(held.now_held):<{width + 2}}{f(held.advice_held)}",
        f"  {'held out':<22}the last {held.held_steps:,} of {held.train_steps + held.held_steps:,} steps; "
        f"buckets in multiples of {held.grid} (held-out cost by multiple: {grids})",
    ]
