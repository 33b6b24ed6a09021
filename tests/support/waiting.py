"""Waiting for something another thread or process does, with a bound that fails the test in one line."""

from __future__ import annotations

import time
from typing import Callable


def wait_for(condition: Callable[[], bool], timeout: float = 10.0, what: str = "the condition") -> None:
    """Poll ``condition`` every 20 ms until it holds; after ``timeout`` seconds the test fails naming ``what``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)
