"""Shared pieces of the fuzz suite (tests/test_fuzz_*.py): hypothesis profiles, value strategies that
reach the awkward corners (huge integers, NaN/Infinity spelled as JSON literals, lone surrogates, deep
nesting), and a wall-clock guard that turns a hang into a failure.

Profiles (``HYPOTHESIS_PROFILE``): ``ci`` (default) is deterministic and sized so the whole fuzz suite
takes about a minute on a 2-core CPU; ``thorough`` runs 20x the examples with fresh randomness, for a
local soak (``HYPOTHESIS_PROFILE=thorough python3 -m pytest -q tests/test_fuzz_*.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from typing import Any, Iterator

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

settings.register_profile(
    "ci",
    max_examples=100,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "thorough",
    max_examples=2000,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

HANG_S = 20.0
"""No single input may take longer than this (the slowest target, a checkpoint load, takes < 1 s)."""


def examples(n: int) -> int:
    """``n`` examples under the ci profile, scaled up under ``thorough``."""
    return max(1, n * settings.default.max_examples // 100)


@contextlib.contextmanager
def no_hang(seconds: float = HANG_S) -> Iterator[None]:
    """Fail (TimeoutError) instead of hanging when the body runs longer than ``seconds``."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"input took longer than {seconds:g} s: a hang")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def assert_one_line(message: str) -> None:
    assert message and "\n" not in message and "Traceback" not in message, repr(message)
    assert len(message) < 1000, f"{len(message)} characters: not a one-line message"


# -- values -------------------------------------------------------------------------------------------

RAW = "\x00RAW:"
"""A string value starting with this is written into JSON as the literal after it (NaN, 1e400, ...)."""

raw_literals = st.sampled_from(
    [
        "NaN",
        "Infinity",
        "-Infinity",
        "1e400",
        "-1e400",
        "1" + "0" * 400,
        "1" + "0" * 5000,
        "-0.0",
        "1e-400",
        "9223372036854775808",
        "18446744073709551616",
    ]
).map(lambda s: RAW + s)
awkward_text = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["", "\ud800", "a\udfffb", "\u2028", "\x85", "\n", "\r\n", "\x00", "\ufeff", "{", "[1,"]),
)
numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**20]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, -0.0, 1e-300, 5e-324, 1e300, 0.5, 1.0, 2.0]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, awkward_text, raw_literals)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)
deeply_nested = st.integers(min_value=30, max_value=5000).map(lambda n: RAW + "[" * n + "]" * n)


def to_json(value: Any, ensure_ascii: bool = True) -> str:
    """json.dumps, with ``RAW``-marked strings spliced in as raw literals."""
    replacements: dict[str, str] = {}

    def mark(v: Any) -> Any:
        if isinstance(v, str) and v.startswith(RAW):
            key = f"__raw_{len(replacements)}__"
            replacements[json.dumps(key)] = v[len(RAW) :]
            return key
        if isinstance(v, list):
            return [mark(x) for x in v]
        if isinstance(v, dict):
            return {k: mark(x) for k, x in v.items()}
        return v

    text = json.dumps(mark(value), ensure_ascii=ensure_ascii)
    for key, literal in replacements.items():
        text = text.replace(key, literal)
    return text
