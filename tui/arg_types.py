"""Argument types for the command line: each turns bad text into argparse's one-line error."""

from __future__ import annotations

import argparse


def nonneg_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text} must be >= 0")
    return v


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v > 0:  # NaN too
        raise argparse.ArgumentTypeError(f"{text} must be positive")
    return v
