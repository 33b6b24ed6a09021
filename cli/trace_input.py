"""A trace command's input and output checked the same way everywhere: OUT first (a wrong OUT costs
nothing, and OUT can never be the trace itself), then the trace read, each problem one usage line."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Union

from .usage import UsageError


def read_checked_trace(trace: Union[str, Path], out: Optional[Union[str, Path]] = None) -> Any:
    """The trace at ``trace``, once ``out`` (when given) is known to be writable and not the trace."""
    from graphtop.engine.telemetry.safe_write import OutputPathError, check_distinct, check_output
    from graphtop.engine.trace_tools.trace import TraceError, read_trace

    if out is not None:
        try:
            check_output(out, "OUT", probe=True)
            check_distinct([("OUT", out)], [("TRACE", trace)])
        except OutputPathError as e:
            raise UsageError(str(e)) from None
    try:
        return read_trace(trace)
    except TraceError as e:
        raise UsageError(str(e)) from None
