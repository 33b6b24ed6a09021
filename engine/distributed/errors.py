"""The error a tensor-parallel run ends with."""

from __future__ import annotations

from ..device import EngineError


class TensorParallelError(EngineError):
    """The tensor-parallel group cannot go on (a rank died, or a step failed half-way, after which the
    ranks no longer agree on which collective comes next). Fatal; the message is one line."""

    fatal = True
