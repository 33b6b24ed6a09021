"""Charts as SVG text, drawn in Python: the trace report's pictures.

Why plain SVG rather than a plotting library: the report must open offline as one file with no network
fetch. A library that embeds its JavaScript (Plotly's is about 3.5 MB) would make every report that
big and run code to draw; SVG is text the browser draws itself, a few kilobytes a chart, with no
dependency to install or keep up to date, and each chart also stands alone as an ``.svg`` file. What
the report needs is simple: lines over time, bars, histograms and marks on an axis.

Every chart takes its numbers already folded (``report_data``); text is escaped here, so trace
strings (fallback reasons, model names) can never become markup. Colours are attributes, not CSS,
so a chart cut out of the page looks the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape
from typing import Optional, Sequence

PALETTE = ("#2f6fdf", "#e8833a", "#3a9d5d", "#c0392b", "#8e5cc4", "#7f8c8d")
INK, GRID, MUTED = "#222", "#e3e3e3", "#777"
WIDTH, HEIGHT = 760, 260
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 34, 44


@dataclass
class Series:
    """One line (``points`` as (x, y)) or one set of bars (``values``, one per label)."""

    name: str
    points: list[tuple[float, float]] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    color: Optional[str] = None
    dashed: bool = False


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values (1, 2 or 5 times a power of ten apart) covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else [0.0]
    raw = (hi - lo) / max(count, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(lo / step) * step
    ticks = []
    value = first
    while value <= hi + step * 1e-9:
        if value >= lo - step * 1e-9:
            ticks.append(round(value, 12))
        value += step
    return ticks


def fmt(value: float) -> str:
    """A tick label: short, no needless decimals (1.5k for 1500)."""
    a = abs(value)
    if a >= 1e9:
        return f"{value / 1e9:g}G"
    if a >= 1e6:
        return f"{value / 1e6:g}M"
    if a >= 1e4:
        return f"{value / 1e3:g}k"
    if a == 0 or a >= 1:
        return f"{value:.4g}"
    return f"{value:.2g}"


class _Frame:
    """The plot area of one chart: scales from data to pixels, axes, grid, title and legend."""

    def __init__(self, title: str, width: int, height: int, left: int = LEFT) -> None:
        self.title, self.width, self.height, self.left = title, width, height, left
        self.x0, self.x1 = left, width - RIGHT
        self.y0, self.y1 = height - BOTTOM, TOP
        self.parts: list[str] = []

    def sx(self, x: float, lo: float, hi: float) -> float:
        return self.x0 + (x - lo) / (hi - lo) * (self.x1 - self.x0) if hi > lo else (self.x0 + self.x1) / 2

    def sy(self, y: float, lo: float, hi: float) -> float:
        return self.y0 - (y - lo) / (hi - lo) * (self.y0 - self.y1) if hi > lo else self.y0

    def y_axis(self, lo: float, hi: float, label: str) -> None:
        for t in nice_ticks(lo, hi):
            y = self.sy(t, lo, hi)
            self.parts.append(f'<line x1="{self.x0}" x2="{self.x1}" y1="{y:.1f}" y2="{y:.1f}" stroke="{GRID}"/>')
            self.text(self.x0 - 6, y + 4, fmt(t), anchor="end", size=11, color=MUTED)
        self.text(14, (self.y0 + self.y1) / 2, label, anchor="middle", size=11, color=MUTED, rotate=True)

    def x_axis(self, lo: float, hi: float, label: str) -> None:
        for t in nice_ticks(lo, hi, 8):
            x = self.sx(t, lo, hi)
            self.parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{self.y0}" y2="{self.y0 + 4}" stroke="{MUTED}"/>')
            self.text(x, self.y0 + 17, fmt(t), anchor="middle", size=11, color=MUTED)
        self.text((self.x0 + self.x1) / 2, self.height - 6, label, anchor="middle", size=11, color=MUTED)

    def base(self) -> None:
        self.parts.append(
            f'<line x1="{self.x0}" x2="{self.x1}" y1="{self.y0}" y2="{self.y0}" stroke="{MUTED}"/>'
            f'<line x1="{self.x0}" x2="{self.x0}" y1="{self.y0}" y2="{self.y1}" stroke="{MUTED}"/>'
        )

    def legend(self, series: Sequence[Series]) -> None:
        x = self.x1
        for i, s in reversed(list(enumerate(series))):
            width = 7 * len(s.name) + 22
            x -= width
            color = s.color or PALETTE[i % len(PALETTE)]
            dash = ' stroke-dasharray="4 3"' if s.dashed else ""
            y = TOP - 12
            self.parts.append(
                f'<line x1="{x}" x2="{x + 14}" y1="{y}" y2="{y}" stroke="{color}" stroke-width="3"{dash}/>'
            )
            self.text(x + 18, TOP - 8, s.name, size=11)

    def text(
        self,
        x: float,
        y: float,
        text: str,
        *,
        anchor: str = "start",
        size: int = 12,
        color: str = INK,
        rotate: bool = False,
        bold: bool = False,
    ) -> None:
        turn = f' transform="rotate(-90 {x:.1f} {y:.1f})"' if rotate else ""
        weight = ' font-weight="600"' if bold else ""
        self.parts.append(
            f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" fill="{color}" text-anchor="{anchor}"{turn}{weight}>'
            f"{escape(text)}</text>"
        )

    def svg(self, note: str = "") -> str:
        self.text(self.left, 16, self.title, size=13, bold=True)
        if note:
            self.text(self.x0 + (self.x1 - self.x0) / 2, (self.y0 + self.y1) / 2, note, anchor="middle", color=MUTED)
        return (
            f'<svg viewBox="0 0 {self.width} {self.height}" '
            f'width="{self.width}" height="{self.height}" font-family="sans-serif" role="img" '
            f'aria-label="{escape(self.title)}"><rect width="100%" height="100%" fill="#fff"/>'
            + "".join(self.parts)
            + "</svg>"
        )


def _span(values: Sequence[float], floor_zero: bool = True) -> tuple[float, float]:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return 0.0, 1.0
    lo, hi = (min(0.0, min(finite)) if floor_zero else min(finite)), max(finite)
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    return lo, hi


def line_chart(
    title: str, series: Sequence[Series], x_label: str, y_label: str, *, width: int = WIDTH, height: int = HEIGHT
) -> str:
    """Lines over a shared x axis (time); an empty chart says "no data"."""
    frame = _Frame(title, width, height)
    xs = [x for s in series for x, _ in s.points]
    ys = [y for s in series for _, y in s.points]
    if not xs:
        return frame.svg("no data in this trace")
    xlo, xhi = _span(xs, floor_zero=False)
    ylo, yhi = _span(ys)
    frame.y_axis(ylo, yhi, y_label)
    frame.x_axis(xlo, xhi, x_label)
    frame.base()
    for i, s in enumerate(series):
        if not s.points:
            continue
        color = s.color or PALETTE[i % len(PALETTE)]
        path = " ".join(f"{frame.sx(x, xlo, xhi):.1f},{frame.sy(y, ylo, yhi):.1f}" for x, y in s.points)
        dash = ' stroke-dasharray="5 4"' if s.dashed else ""
        frame.parts.append(
            f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.5" stroke-linejoin="round"{dash}/>'
        )
    frame.legend(series)
    return frame.svg()


def bar_chart(
    title: str,
    labels: Sequence[str],
    series: Sequence[Series],
    y_label: str,
    *,
    x_label: str = "",
    width: int = WIDTH,
    height: int = HEIGHT,
) -> str:
    """Grouped vertical bars: one group per label, one bar per series (its ``values``)."""
    frame = _Frame(title, width, height)
    if not labels or not series:
        return frame.svg("no data in this trace")
    lo, hi = _span([v for s in series for v in s.values])
    frame.y_axis(lo, hi, y_label)
    frame.base()
    group = (frame.x1 - frame.x0) / len(labels)
    bar = max(1.0, min(28.0, group * 0.8 / len(series)))
    every = max(1, math.ceil(len(labels) * 34 / (frame.x1 - frame.x0)))  # keep labels from overlapping
    for g, label in enumerate(labels):
        left = frame.x0 + g * group + (group - bar * len(series)) / 2
        for i, s in enumerate(series):
            value = s.values[g] if g < len(s.values) else 0.0
            if not math.isfinite(value):
                continue
            y = frame.sy(value, lo, hi)
            color = s.color or PALETTE[i % len(PALETTE)]
            frame.parts.append(
                f'<rect x="{left + i * bar:.1f}" y="{min(y, frame.y0):.1f}" width="{bar:.1f}" '
                f'height="{abs(frame.y0 - y):.1f}" fill="{color}"><title>{escape(label)}: '
                f"{escape(s.name)} {escape(fmt(value))}</title></rect>"
            )
        if g % every == 0:
            frame.text(frame.x0 + (g + 0.5) * group, frame.y0 + 17, label, anchor="middle", size=11, color=MUTED)
    if x_label:
        frame.text((frame.x0 + frame.x1) / 2, frame.height - 6, x_label, anchor="middle", size=11, color=MUTED)
    frame.legend(series)
    return frame.svg()


def hbar_chart(title: str, rows: Sequence[tuple[str, float]], x_label: str, *, width: int = WIDTH) -> str:
    """Horizontal bars, one row each (a label and a count), largest first as given."""
    height = TOP + 24 * max(len(rows), 1) + BOTTOM
    left = min(320, 16 + 7 * max((len(label) for label, _ in rows), default=10))
    frame = _Frame(title, width, height, left=left)
    if not rows:
        return frame.svg("none in this trace")
    hi = max(v for _, v in rows) or 1.0
    frame.x_axis(0.0, hi, x_label)
    frame.base()
    for i, (label, value) in enumerate(rows):
        y = TOP + 6 + 24 * i
        w = frame.sx(value, 0.0, hi) - frame.x0
        frame.parts.append(
            f'<rect x="{frame.x0}" y="{y}" width="{w:.1f}" height="16" fill="{PALETTE[1]}">'
            f"<title>{escape(label)}: {escape(fmt(value))}</title></rect>"
        )
        frame.text(frame.x0 - 6, y + 12, label, anchor="end", size=11)
        frame.text(frame.x0 + w + 4, y + 12, fmt(value), size=11, color=MUTED)
    return frame.svg()


def histogram(
    title: str,
    values: Sequence[float],
    x_label: str,
    *,
    bins: int = 30,
    marks: Sequence[tuple[str, float]] = (),
    width: int = WIDTH // 2 - 8,
    height: int = HEIGHT,
) -> str:
    """Counts of ``values`` in ``bins`` equal bins, with vertical ``marks`` (p50, p99…) labelled."""
    frame = _Frame(title, width, height, left=48)
    finite = sorted(v for v in values if math.isfinite(v))
    if not finite:
        return frame.svg("no data in this trace")
    lo, hi = finite[0], finite[-1]
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    counts = [0] * bins
    for v in finite:
        counts[min(bins - 1, int((v - lo) / (hi - lo) * bins))] += 1
    top = max(counts)
    frame.y_axis(0.0, float(top), "count")
    frame.x_axis(lo, hi, x_label)
    frame.base()
    step = (frame.x1 - frame.x0) / bins
    for i, c in enumerate(counts):
        if c:
            y = frame.sy(c, 0.0, top)
            frame.parts.append(
                f'<rect x="{frame.x0 + i * step + 0.5:.1f}" y="{y:.1f}" width="{max(step - 1, 1):.1f}" '
                f'height="{frame.y0 - y:.1f}" fill="{PALETTE[0]}" fill-opacity="0.8"/>'
            )
    for n, (name, value) in enumerate(marks):
        if not math.isfinite(value):
            continue
        x = frame.sx(value, lo, hi)
        frame.parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{frame.y0}" y2="{frame.y1}" stroke="{PALETTE[3]}" '
            'stroke-dasharray="3 3"/>'
        )
        right = x > (frame.x0 + frame.x1) / 2  # label on the side with room
        label = f"{name} {fmt(value)}"
        frame.text(x + (-3 if right else 3), frame.y1 + 10 + 12 * n, label, anchor="end" if right else "start", size=10)
    return frame.svg()


def marks_chart(
    title: str, rows: Sequence[tuple[str, Sequence[int]]], x_label: str, *, width: int = WIDTH, log: bool = True
) -> str:
    """Rows of marks on one shared axis (bucket lists side by side), each mark labelled with its value."""
    height = TOP + 40 * max(len(rows), 1) + BOTTOM
    frame = _Frame(title, width, height, left=110)
    values = [v for _, vs in rows for v in vs if v > 0]
    if not values:
        return frame.svg("no bucket lists in this trace")
    scale = (lambda v: math.log2(v)) if log else (lambda v: float(v))
    lo, hi = scale(min(values)), scale(max(values))
    if hi <= lo:
        lo, hi = lo - 1, hi + 1
    pad = (hi - lo) * 0.04
    lo, hi = lo - pad, hi + pad
    frame.base()
    frame.text((frame.x0 + frame.x1) / 2, frame.height - 6, x_label, anchor="middle", size=11, color=MUTED)
    for r, (name, vs) in enumerate(rows):
        y = TOP + 24 + 40 * r
        frame.text(frame.x0 - 8, y + 4, name, anchor="end", size=12)
        frame.parts.append(f'<line x1="{frame.x0}" x2="{frame.x1}" y1="{y}" y2="{y}" stroke="{GRID}"/>')
        labelled = [-1e9, -1e9]  # the last labelled x above and below the row: labels never overlap
        for i, v in enumerate(sorted(set(vs))):
            if v <= 0:
                continue
            x = frame.sx(scale(v), lo, hi)
            color = PALETTE[r % len(PALETTE)]
            frame.parts.append(f'<circle cx="{x:.1f}" cy="{y}" r="5" fill="{color}"><title>{v}</title></circle>')
            side = i % 2
            if x - labelled[side] >= 7 * len(str(v)) + 6:
                labelled[side] = x
                frame.text(x, y + (-9 if side else 18), str(v), anchor="middle", size=10, color=MUTED)
    return frame.svg()


def standalone(svg: str) -> str:
    """``svg`` as the content of an ``.svg`` file (a chart inside HTML needs no namespace; a file does)."""
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + svg.replace(
        "<svg ", '<svg xmlns="http://www.w3.org/2000/svg" ', 1
    )
