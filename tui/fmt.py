"""Small, pure formatting helpers shared by the panels (no textual import, easy to unit test)."""

from __future__ import annotations

from typing import Optional

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def human_bytes(n: Optional[float]) -> str:
    """Binary-prefixed size, 3 significant-ish digits: engineers compare GiB, not raw bytes."""
    if n is None:
        return "—"
    value = float(n)
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit in _UNITS:
        if value < 1024 or unit == _UNITS[-1]:
            if unit == "B":
                return f"{sign}{int(value)} B"
            return f"{sign}{value:.1f} {unit}" if value < 100 else f"{sign}{value:.0f} {unit}"
        value /= 1024
    return f"{sign}{value:.1f} TiB"  # pragma: no cover - loop always returns


def ms(value: Optional[float]) -> str:
    """Milliseconds with precision that matches their size (replay times span µs to seconds)."""
    if value is None:
        return "—"
    if value < 1:
        return f"{value:.3f}"
    if value < 100:
        return f"{value:.2f}"
    return f"{value:.0f}"


def secs(value: Optional[float]) -> str:
    """Seconds for capture costs: sub-second captures are common, so keep two decimals there."""
    if value is None:
        return "—"
    return f"{value:.2f}s" if value < 10 else f"{value:.1f}s"


def pct(value: Optional[float]) -> str:
    """A 0..1 fraction as a percentage."""
    if value is None:
        return "—"
    return f"{value * 100:.1f}%"


def bar(fraction: float, width: int, full: str = "█", empty: str = "░") -> str:
    """A text bar for places where a ProgressBar widget per row would be too heavy."""
    fraction = min(max(fraction, 0.0), 1.0)
    filled = round(fraction * width)
    return full * filled + empty * (width - filled)


def short(text: str, width: int) -> str:
    """Truncate with an ellipsis; prompts and reasons can be arbitrarily long."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"
