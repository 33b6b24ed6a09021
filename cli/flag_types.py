"""Value types of the command-line flags: the range and finiteness checks argparse runs per flag.

Every number a flag takes is checked here, before anything loads: ``nan`` and ``inf`` parse as floats
in Python and would otherwise pass a ``< 0`` test and fail minutes later, after the model loaded.
Integer flags stop at ``MAX_FLAG_INT``: every size the engine takes fits in 31 bits, and the sizes
that must also fit in memory are checked against the machine where they are allocated.
"""

from __future__ import annotations

import argparse
import math
import re
from typing import Callable, Optional

from graphtop.engine.arguments import short_repr
from graphtop.engine.telemetry.plain_text import one_line

MAX_FLAG_INT = 2**31 - 1
MAX_SYNTHETIC_REQUESTS = 100_000
"""``--synthetic N`` builds every request up front (prompt token ids included)."""
MAX_SEED = 2**63 - 1
"""Request i of a synthetic run is seeded ``seed + i``, which must stay a 64-bit torch seed."""


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:  # also for more than 4300 digits (int-from-string limit)
        raise argparse.ArgumentTypeError(f"{short_repr(text)} is not an integer (or has too many digits)") from None


def int_in(lo: int, hi: int = MAX_FLAG_INT) -> Callable[[str], int]:
    """An integer flag in [lo, hi]."""

    def parse(text: str) -> int:
        v = _int(text)
        if v < lo:
            raise argparse.ArgumentTypeError(
                f"{short_repr(text)} must be positive" if lo == 1 else f"{short_repr(text)} must be >= {lo}"
            )
        if v > hi:
            raise argparse.ArgumentTypeError(f"{short_repr(text)} is over the limit of {hi}")
        return v

    return parse


positive_int = int_in(1)
nonneg_int = int_in(0)


def finite_float(
    lo: Optional[float] = None, hi: Optional[float] = None, *, lo_open: bool = False
) -> Callable[[str], float]:
    """A finite float flag with optional bounds (``lo_open``: strictly above ``lo``)."""

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{short_repr(text)} is not a number") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{short_repr(text)} is not a finite number")
        if lo is not None and (v <= lo if lo_open else v < lo):
            rule = "positive" if lo_open and lo == 0 else f"{'>' if lo_open else '>='} {lo:g}"
            raise argparse.ArgumentTypeError(f"{short_repr(text)} must be {rule}")
        if hi is not None and v > hi:
            raise argparse.ArgumentTypeError(f"{short_repr(text)} must be <= {hi:g}")
        return v

    return parse


positive_float = finite_float(0.0, lo_open=True)
nonneg_float = finite_float(0.0)


def nonempty(what: str) -> Callable[[str], str]:
    """A text flag that must not be empty: code tests these values for truth (``if args.telemetry``), so
    ``--flag ''`` would read as no flag at all and do something else than asked, without a word."""

    def parse(text: str) -> str:
        if not text:
            raise argparse.ArgumentTypeError(f"an empty {what}")
        return text

    return parse


file_path = nonempty("path")
"""A path flag: ``--prompts ''`` would open the dashboard instead of the headless run asked for."""


def serve_address(text: str) -> tuple[str, int]:
    """``[HOST:]PORT`` (``8000``, ``0.0.0.0:8000``, ``[::1]:8000``) as (host, port); the host defaults to
    127.0.0.1, the one address only this machine reaches."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", text
    host = host.strip("[]") if host.startswith("[") and host.endswith("]") else host
    if sep and not host:
        raise argparse.ArgumentTypeError(f"{short_repr(text)}: the host before ':' is empty (use PORT or HOST:PORT)")
    if ":" in host and not text.startswith("["):
        raise argparse.ArgumentTypeError(f"{short_repr(text)}: write an IPv6 host in brackets, [::1]:PORT")
    try:
        number = int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{short_repr(text)} is not [HOST:]PORT") from None
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"port {number} is not in 0..65535")
    return host, number


MAX_SIZE = float(2**63)
"""Bytes a size flag may name: what a 64-bit count (and a trace's numbers) can hold."""
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kib": 1024,
    "kb": 1000,
    "m": 1024**2,
    "mib": 1024**2,
    "mb": 1000**2,
    "g": 1024**3,
    "gib": 1024**3,
    "gb": 1000**3,
    "t": 1024**4,
    "tib": 1024**4,
    "tb": 1000**4,
}


def parse_size(text: str) -> float:
    """Bytes in ``512MiB``, ``1.5G``, ``300MB`` or ``1000000`` (K/M/G/T and KiB/MiB/... are binary,
    KB/MB/... decimal)."""
    m = _SIZE.fullmatch(text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 512MiB, 2GiB, 1500000)")
    size = float(m.group(1)) * _UNITS[unit]
    if not size <= MAX_SIZE:  # 1e400 became inf: "graph memory inf TiB" was advised
        raise argparse.ArgumentTypeError(f"{one_line(text)[:40]!r} is past the largest size, 8 EiB")
    return size
