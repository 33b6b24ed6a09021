"""The one exception type a checkpoint problem surfaces as.

The TUI and CLI show `str(err)` verbatim, so every message is a single line that
names the problem and the path; it subclasses ValueError so generic callers that
only know "bad input" still catch it.
"""

from __future__ import annotations

import re


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be served; the message is one line."""

    def __init__(self, message: str) -> None:
        super().__init__(re.sub(r"\s*[\r\n]+\s*", " ", str(message)).strip())
