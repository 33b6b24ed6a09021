"""The engine's errors: what a caller can catch, each with a one-line message."""

from __future__ import annotations


class EngineError(RuntimeError):
    """A problem the user can fix (bad device, backend unavailable, …); the message is one line."""


class TensorParallelError(EngineError):
    """The tensor-parallel group cannot go on (a rank died, or a step failed half-way, after which the
    ranks no longer agree on which collective comes next). Fatal; the message is one line."""

    fatal = True
