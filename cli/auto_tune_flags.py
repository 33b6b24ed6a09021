"""``--auto-tune`` and its settings, for headless runs and ``graphtop serve``: the flags, and the tuner
they start beside the engine (``engine/auto_tune.py``). Off by default: a recapture is the user's call
unless asked for."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, Optional

from .flag_types import finite_float, int_in, parse_size

LOGGER = "graphtop.auto_tune"
DEFAULTS = {"every": 30.0, "min_interval": 300.0, "threshold": 0.05, "window": 4096}
"""The flags' defaults; ``AutoTuneConfig``'s, repeated here so the parser imports no engine module."""


def add_auto_tune_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("auto-tune (headless and serve)")
    g.add_argument(
        "--auto-tune",
        action="store_true",
        help="re-advise the graph bucket lists from the traffic served and recapture live when the "
        "advice lowers the held-out step cost enough (off by default)",
    )
    g.add_argument(
        "--auto-tune-every",
        type=finite_float(0.0),
        default=DEFAULTS["every"],
        metavar="SECONDS",
        help=f"re-advise this often (default {DEFAULTS['every']:g})",
    )
    g.add_argument(
        "--auto-tune-min-interval",
        type=finite_float(0.0),
        default=DEFAULTS["min_interval"],
        metavar="SECONDS",
        help=f"never recapture more often than this (default {DEFAULTS['min_interval']:g})",
    )
    g.add_argument(
        "--auto-tune-threshold",
        type=finite_float(0.0, 0.99),
        default=DEFAULTS["threshold"],
        metavar="F",
        help=f"held-out step cost a phase's advice must save, a fraction (default {DEFAULTS['threshold']:g})",
    )
    g.add_argument(
        "--auto-tune-max-graph-memory",
        type=parse_size,
        metavar="SIZE",
        help="estimated graph memory per phase the advice may take (e.g. 512MiB; default: unbounded)",
    )
    g.add_argument(
        "--auto-tune-window",
        type=int_in(8),
        default=DEFAULTS["window"],
        metavar="STEPS",
        help=f"steps of each phase the demand window keeps (default {DEFAULTS['window']})",
    )


class RunningTuner:
    """The tuner of a run, and the stderr handler that prints its lines in a headless run."""

    def __init__(self, tuner: Any, handler: Optional[logging.Handler]) -> None:
        self.tuner, self.handler = tuner, handler

    def close(self) -> None:
        self.tuner.close()
        if self.handler is not None:
            logging.getLogger(LOGGER).removeHandler(self.handler)


def start_auto_tune(engine: Any, args: Any, *, log_to_stderr: bool = True) -> Optional[RunningTuner]:
    """The running tuner when ``--auto-tune`` is on, else None; ``close()`` it before the engine.
    ``log_to_stderr``: each recapture is a line on stderr (``graphtop serve`` logs it itself)."""
    if not getattr(args, "auto_tune", False):
        return None
    from graphtop.engine.auto_tune import AutoTuneConfig, AutoTuner

    config = AutoTuneConfig(
        every_s=args.auto_tune_every,
        min_interval_s=args.auto_tune_min_interval,
        threshold=args.auto_tune_threshold,
        max_memory=args.auto_tune_max_graph_memory,
        window=args.auto_tune_window,
    )
    handler = None
    if log_to_stderr:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("graphtop: %(message)s"))
        logger = logging.getLogger(LOGGER)
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    return RunningTuner(AutoTuner(engine, config).start(), handler)
