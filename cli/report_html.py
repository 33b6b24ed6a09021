"""``graphtop trace report``'s page: one self-contained HTML file of SVG charts (``svg_charts``).

Self-contained means it opens offline and fetches nothing: no script, no stylesheet, font or image
from anywhere, every chart inline. Trace text (model names, fallback reasons, error messages) is
escaped, so a trace cannot add markup to the page. The numbers come folded from ``report_data``.
"""

from __future__ import annotations

import html
import shlex
from typing import Optional, Sequence

from graphtop.engine.telemetry.capture import CapturePass
from graphtop.engine.trace_tools.stats import Percentiles

from . import svg_charts as c
from .report_data import ReportData

MIB = float(1 << 20)

CHARTS = (
    ("steps", "Step time and host time over the run"),
    ("buckets", "Bucket hits and padding per bucket"),
    ("fallbacks", "Fallback reasons"),
    ("latency", "TTFT, inter-token latency and queue time"),
    ("kv", "KV use"),
    ("capture", "Capture time and memory per bucket"),
    ("advice", "The advisor's bucket lists beside today's"),
)
"""(section id, heading) of every chart section, in page order: the tests check each is there."""

STYLE = """
body{font-family:sans-serif;margin:24px auto;max-width:1560px;color:#222;background:#fafafa}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
.meta{color:#555;font-size:13px;margin:2px 0}.note{color:#8a5a00;font-size:13px}
.grid{display:flex;flex-wrap:wrap;gap:12px}.grid svg{border:1px solid #e5e5e5;border-radius:4px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}td,th{padding:3px 10px;text-align:left}
th{background:#f0f0f0}tr:nth-child(even) td{background:#f7f7f7}code{font-size:12px;word-break:break-all}
.kpi{display:inline-block;margin:6px 18px 0 0}.kpi b{display:block;font-size:18px}
"""


def _e(text: object) -> str:
    return html.escape(str(text))


def _pct(value: Optional[float]) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def _ms(value: Optional[float]) -> str:
    return "—" if value is None else f"{value:.2f} ms"


def _size(value: Optional[float]) -> str:
    if value is None:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return "unknown"


def _section(key: str, body: str, intro: str = "") -> str:
    heading = dict(CHARTS)[key]
    text = f'<p class="meta">{_e(intro)}</p>' if intro else ""
    return f'<section id="{key}"><h2>{_e(heading)}</h2>{text}<div class="grid">{body}</div></section>'


def _marks(p: Percentiles) -> list[tuple[str, float]]:
    return [(name, v) for name, v in (("p50", p.p50), ("p99", p.p99)) if v is not None]


def _header(data: ReportData) -> str:
    s = data.summary
    lines = [f"<h1>graphtop trace report</h1><p class='meta'>{_e(data.path)}</p>"]
    if s.engine is not None:
        e = s.engine
        lines.append(
            f"<p class='meta'>model {_e(e.model or '?')} ({_e(e.architecture or '?')}) on "
            f"{_e(e.device_name or e.device or '?')}, dtype {_e(e.dtype or '?')}, graphs decode "
            f"{_e(e.decode_graph_backend or '-')} · prefill {_e(e.prefill_graph_backend or '-')}</p>"
        )
    if s.emulated:
        lines.append(
            "<p class='note'>EMULATED run: graph replays were emulated; timings are not CUDA-graph timings.</p>"
        )
    if s.truncated_tail:
        lines.append("<p class='note'>The trace's last line was incomplete and was skipped (writer killed?).</p>")
    kpis = [
        ("events", f"{s.events:,}"),
        ("wall", f"{s.wall_s:.2f} s"),
        ("steps", f"{s.steps:,}"),
        ("graph hit rate", _pct(s.hit_rate)),
        ("padding waste", _pct(s.padding_waste)),
        ("requests", f"{s.requests_finished:,} / {s.requests_queued:,}"),
        ("output tokens/s", f"{s.tokens_per_s:,.1f}"),
    ]
    lines.append("".join(f"<span class='kpi'>{_e(k)}<b>{_e(v)}</b></span>" for k, v in kpis))
    return "".join(lines)


def _steps(data: ReportData) -> str:
    step_mean, step_peak = data.step_ms.binned()
    host_mean, _ = data.host_ms.binned()
    series = [c.Series("step time", step_mean), c.Series("host time", host_mean)]
    if step_peak:
        series.append(c.Series("step time, bin max", step_peak, color="#9bb8ee", dashed=True))
    chart = c.line_chart(dict(CHARTS)["steps"], series, "seconds into the run", "ms")
    return _section(
        "steps",
        chart,
        "Step time: on the device where measured (graph replay; eager forward on CUDA), else the host's wall "
        "time of the step. Host time: the host's wall time to run or launch it."
        + (f" Averaged into {len(step_mean)} bins." if step_peak else ""),
    )


def _buckets(data: ReportData) -> str:
    charts = []
    for phase, ph in data.summary.phases.items():
        if not ph.buckets:
            continue
        labels = [str(b) for b in ph.buckets]
        unit = "batch size" if phase == "decode" else "tokens"
        charts.append(
            c.bar_chart(
                f"{phase}: graph steps per bucket",
                labels,
                [c.Series("graph steps", values=[float(t.count) for t in ph.buckets.values()])],
                "steps",
                x_label=f"bucket ({unit})",
                width=c.WIDTH // 2 - 8,
            )
        )
        charts.append(
            c.bar_chart(
                f"{phase}: padding per bucket",
                labels,
                [c.Series("padding waste %", values=[100 * t.waste for t in ph.buckets.values()], color=c.PALETTE[1])],
                "% of bucket tokens",
                x_label=f"bucket ({unit})",
                width=c.WIDTH // 2 - 8,
            )
        )
    if not charts:
        charts.append(c.bar_chart("graph steps per bucket", [], [], "steps"))
    return _section("buckets", "".join(charts), "Graph steps only; padding = padded tokens ÷ the bucket's tokens.")


def _fallbacks(data: ReportData) -> str:
    rows = [(reason, float(n)) for reason, n in data.summary.fallbacks]
    return _section("fallbacks", c.hbar_chart("eager steps by fallback reason", rows, "steps"))


def _latency(data: ReportData) -> str:
    charts = []
    for title, values in (("TTFT", data.ttft_ms), ("inter-token latency", data.itl_ms), ("queue time", data.queue_ms)):
        p = Percentiles.of(values)
        charts.append(c.histogram(f"{title} ({p.count} requests)", values, "ms", marks=_marks(p)))
    return _section(
        "latency",
        "".join(charts),
        "Per request. Inter-token latency: (latency − TTFT) ÷ (tokens − 1), as /metrics counts it. Queue "
        "time: the part of TTFT before the scheduler first admitted the request (traces of older "
        "versions do not have it).",
    )


def _kv(data: ReportData) -> str:
    used, _ = data.kv_used.binned()
    capacity, _ = data.kv_capacity.binned()
    chart = c.line_chart(
        dict(CHARTS)["kv"],
        [c.Series("used tokens", used), c.Series("capacity", capacity, color=c.MUTED, dashed=True)],
        "seconds into the run",
        "tokens",
    )
    s = data.summary
    peak = f"peak {s.kv_peak_used_tokens:,} of {s.kv_capacity_tokens:,} tokens" if s.kv_capacity_tokens else ""
    return _section("kv", chart, peak)


def _latest_passes(captures: Sequence[CapturePass]) -> list[CapturePass]:
    latest: dict[str, CapturePass] = {}
    for cap in captures:
        latest[cap.phase] = cap
    return list(latest.values())


def _capture(data: ReportData) -> str:
    charts = []
    notes = []
    for cap in _latest_passes(data.summary.captures):
        costs = sorted((cost for cost in cap.costs if cost.ok), key=lambda cost: cost.bucket)
        if not costs:
            continue
        labels = [str(cost.bucket) for cost in costs]
        charts.append(
            c.bar_chart(
                f"{cap.phase}: capture time",
                labels,
                [c.Series("seconds", values=[cost.seconds for cost in costs], color=c.PALETTE[4])],
                "s",
                x_label="bucket",
                width=c.WIDTH // 2 - 8,
            )
        )
        charts.append(
            c.bar_chart(
                f"{cap.phase}: graph memory",
                labels,
                [c.Series("MiB", values=[cost.memory_bytes / MIB for cost in costs], color=c.PALETTE[2])],
                "MiB",
                x_label="bucket",
                width=c.WIDTH // 2 - 8,
            )
        )
        failed = ", ".join(str(b) for b in cap.failed)
        notes.append(
            f"{cap.phase}: {cap.reason} pass, {len(costs)} captured in {cap.seconds:.2f} s, {_size(cap.memory_bytes)}"
            + (f", failed {failed}" if failed else "")
        )
    if not charts:
        charts.append(c.bar_chart("capture time", [], [], "s"))
    return _section("capture", "".join(charts), "; ".join(notes) + ("." if notes else ""))


def _advice(data: ReportData) -> str:
    from .advise import graph_config_json

    a = data.advice
    if a is None:
        chart = c.marks_chart(dict(CHARTS)["advice"], [], "bucket (log scale)")
        return _section("advice", chart, f"No advice: {data.advice_note}")
    rows: list[tuple[str, Sequence[int]]] = []
    table = ["<table><tr><th>phase</th><th></th><th>now</th><th>advice</th></tr>"]
    for phase, budget, advice, demand, _ in a.reports:
        now, new = getattr(a.now, phase), getattr(a.new, phase)
        rows.append((f"{phase} now", a.current[phase]))
        rows.append((f"{phase} advice", list(advice.buckets)))
        for name, x, y in (
            ("graphs", len(a.current[phase]), len(advice.buckets)),
            ("hit rate", _pct(now.hit_rate), _pct(new.hit_rate)),
            ("padding waste", _pct(now.padding_waste), _pct(new.padding_waste)),
            ("graph memory (est.)", _size(now.est_memory_bytes), _size(new.est_memory_bytes)),
        ):
            table.append(f"<tr><td>{_e(phase)}</td><td>{_e(name)}</td><td>{_e(x)}</td><td>{_e(y)}</td></tr>")
    table.append("</table>")
    flag = "--cuda-graph-config " + shlex.quote(graph_config_json(a.advised, a.cap))
    chart = c.marks_chart(dict(CHARTS)["advice"], rows, "bucket (log scale)")
    return _section(
        "advice",
        chart + "<div>" + "".join(table) + f"<p class='meta'>to capture the advice: <code>{_e(flag)}</code></p></div>",
        "What graphtop advise prints, at the trace's graph count per phase (graphtop advise takes budgets).",
    )


def render(data: ReportData) -> str:
    """The whole page."""
    sections = [_steps, _buckets, _fallbacks, _latency, _kv, _capture, _advice]
    body = _header(data) + "".join(section(data) for section in sections)
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>graphtop trace report: {_e(data.path)}</title><style>{STYLE}</style></head>"
        f"<body>{body}</body></html>\n"
    )
