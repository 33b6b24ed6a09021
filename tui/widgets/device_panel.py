"""GPU and host health next to the engine's own numbers (NVML + psutil, sampled at ~1 Hz).

Without NVML the panel shows a calm "no NVIDIA GPU" line: CPU runs and CI are normal, not errors.
"""

from __future__ import annotations

from typing import Optional

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.widgets import Static

from ..device_probe import DeviceSample
from ..fmt import bar, human_bytes
from .panel import drawable, set_content


def _opt(value: Optional[float], fmt: str) -> str:
    return "—" if value is None else fmt.format(value)


class DevicePanel(Vertical):
    """Renders the latest :class:`DeviceSample`; fed by DeviceSampled messages, not the state."""

    def __init__(self, *, polling: bool = True, id: str | None = None) -> None:
        super().__init__(id=id, classes="panel")
        self.border_title = "device"
        self.polling = polling
        self.sample: Optional[DeviceSample] = None

    def compose(self) -> ComposeResult:
        yield Static(id="device-body")

    def on_mount(self) -> None:
        self.show(self.sample)

    def show(self, sample: Optional[DeviceSample]) -> None:
        """Render ``sample``; an identical text (same numbers as last second) costs no repaint."""
        self.sample = sample
        bodies = self.query("#device-body")
        if not bodies or not drawable(self):  # a sample before compose (on_mount shows the latest one) or at exit
            return
        body = bodies.first(Static)
        if sample is None:
            text = "sampling…" if self.polling else "device polling off"
            set_content(body, Content.from_markup("[$text-muted]$t[/]", t=text))
            return
        lines: list[Content] = []
        for g in sample.gpus:
            frac = g.memory_used / g.memory_total if g.memory_total else 0.0
            lines.append(Content.from_markup("[b]$name[/b] [$text-muted]#$i[/]", name=g.name, i=str(g.index)))
            lines.append(
                Content.from_markup(
                    "mem [$primary]$bar[/] $u / $t",
                    bar=bar(frac, 10),
                    u=human_bytes(g.memory_used),
                    t=human_bytes(g.memory_total),
                )
            )
            lines.append(
                Content.from_markup(
                    "util $u · power $p / $l · $c",
                    u=_opt(g.utilization_pct, "{:.0f}%"),
                    p=_opt(g.power_w, "{:.0f} W"),
                    l=_opt(g.power_limit_w, "{:.0f} W"),
                    c=_opt(g.temperature_c, "{:.0f}°C"),
                )
            )
        if not sample.gpus:
            lines.append(Content.from_markup("[$text-muted]$n — host only[/]", n=sample.gpu_note or "no NVIDIA GPU"))
        ram = sample.ram_used / sample.ram_total if sample.ram_total else 0.0
        lines.append(
            Content.from_markup(
                "host cpu $c of $n · [$text-muted]graphtop rss $r[/]",
                c=f"{sample.cpu_pct:.0f}%",
                n=str(sample.cpu_count),
                r=human_bytes(sample.process_rss),
            )
        )
        lines.append(
            Content.from_markup(
                "ram [$secondary]$bar[/] $u / $t",
                bar=bar(ram, 10),
                u=human_bytes(sample.ram_used),
                t=human_bytes(sample.ram_total),
            )
        )
        set_content(body, Content("\n").join(lines))
