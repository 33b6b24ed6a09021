"""``graphtop trace report TRACE.jsonl [-o report.html]``: a trace as one self-contained HTML page of charts.

Offline trace tooling, as ``trace summary`` and ``advise`` are: nothing here is imported by the engine
(the page is ``report_html``, its numbers ``report_data``, its charts ``svg_charts``). OUT is checked
before the trace is read, is never the trace itself, and is written whole or not at all.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from graphtop.engine.telemetry.plain_text import one_line

from .trace_input import read_checked_trace
from .usage import UsageError


def run_report(args: argparse.Namespace) -> int:
    from graphtop.engine.telemetry.safe_write import OutputPathError, write_atomic

    from .report_data import collect
    from .report_html import render

    if args.out is None:
        args.out = Path(args.trace).with_suffix(".html")
    trace = read_checked_trace(args.trace, args.out)
    page = render(collect(trace)).encode("utf-8")
    try:
        write_atomic(args.out, lambda f: f.write(page), "OUT")
    except OSError as e:
        raise UsageError(f"cannot write {args.out}: {e.strerror or e}") from None
    except OutputPathError as e:
        raise UsageError(str(e)) from None
    size = f"{len(page) / 1024:.0f} KiB"
    print(f"wrote {one_line(str(args.out))} ({len(trace.events)} events, {size}); open it in a browser")
    return 0
