"""Argument types for the command line: each turns bad text into argparse's one-line error."""

from __future__ import annotations

import argparse
from typing import Callable, TypeVar

N = TypeVar("N", int, float)


def _number(convert: Callable[[str], N], what: str, ok: Callable[[N], bool], rule: str) -> Callable[[str], N]:
    def parse(text: str) -> N:
        try:
            v = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not ok(v):  # NaN fails every rule
            raise argparse.ArgumentTypeError(f"{text} must be {rule}")
        return v

    return parse


positive_int = _number(int, "an integer", lambda v: v > 0, "positive")
nonneg_int = _number(int, "an integer", lambda v: v >= 0, ">= 0")
positive_float = _number(float, "a number", lambda v: v > 0, "positive")
nonneg_float = _number(float, "a number", lambda v: v >= 0, ">= 0")
