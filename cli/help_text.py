"""What ``graphtop --help`` says beyond the parser's own lines: the subcommands, examples, the format
and default of every flag.

``document(parser)`` gives each flag that has no help text (or no format) the one from ``FLAG_DOCS``,
and ``HelpFormatter`` appends the default to every flag that has one, so no flag is left without
its meaning, its format and its default. The subcommands are dispatched by hand in ``cli._main``
(each has its own parser), so the top-level help lists them from ``COMMANDS``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Optional

COMMANDS: tuple[tuple[str, str], ...] = (
    ("trace summary TRACE", "a text report of a recorded trace"),
    ("trace report TRACE", "its charts in one HTML file that opens offline"),
    ("trace export TRACE OUT", "the trace as Perfetto JSON, for ui.perfetto.dev"),
    ("advise TRACE", "bucket lists that workload should have had"),
    ("attach [ENDPOINT]", "the dashboard on a running engine (q detaches)"),
    ("ps", "the engines of this user one can attach to"),
    ("serve", "an OpenAI-compatible HTTP API with Prometheus metrics"),
    ("web [TARGET]", "a running engine's dashboard, served to browsers"),
)

EXAMPLES: tuple[tuple[str, str], ...] = (
    ("graphtop", "dashboard, demo model"),
    ("graphtop --model ~/models/Qwen3-0.6B", "dashboard, a checkpoint"),
    ("graphtop --prompts p.jsonl --output out.jsonl", "headless prompts"),
    ("graphtop --synthetic 200 --record run.jsonl", "synthetic load, recorded"),
    ("graphtop --replay run.jsonl", "replay it in the dashboard"),
    ("graphtop trace summary run.jsonl", "what the run did"),
    ("graphtop trace export run.jsonl run.json", "... for ui.perfetto.dev"),
    ("graphtop advise run.jsonl --max-graphs 8", "better bucket lists"),
    ("graphtop --synthetic 1000 --telemetry", "a run others can watch,"),
    ("graphtop attach", "... from another terminal"),
    ("graphtop serve --model ~/models/Qwen3-0.6B", "OpenAI API on 127.0.0.1:8000"),
    ("graphtop serve --dashboard", "... the dashboard at :8001"),
)


def commands_epilog() -> str:
    """The top-level help's tail: every subcommand with a line, and examples (each line < 80)."""
    width = max(len(c) for c, _ in COMMANDS) + 2
    ex_width = max(len(c) for c, _ in EXAMPLES) + 2
    lines = ["commands (graphtop COMMAND --help says more):"]
    lines += [f"  {c:<{width}}{what}" for c, what in COMMANDS]
    lines += ["", "examples:"]
    lines += [f"  {c:<{ex_width}}# {what}" for c, what in EXAMPLES]
    lines += ["", "Errors print one line, graphtop: error: ..., and exit with status 2."]
    return "\n".join(lines)


USAGE = (
    "graphtop [--model PATH] [options]\n       graphtop {trace,advise,attach,ps,serve,web} ...   (see commands below)"
)


@dataclass(frozen=True)
class FlagDoc:
    help: str = ""  # used when the flag's own line has none
    metavar: Optional[str] = None  # the value's format, when the line gives none
    default: Optional[str] = None  # said when the help does not say it and argparse has no value to show


FLAG_DOCS: dict[str, FlagDoc] = {
    "--model": FlagDoc(metavar="PATH"),
    "--device": FlagDoc(metavar="DEVICE"),
    "--attention-backend": FlagDoc("auto: flashinfer on CUDA when it is installed and fits the KV layout, else torch"),
    "--page-size": FlagDoc(metavar="N"),
    "--chunked-prefill-size": FlagDoc(metavar="N"),
    "--max-running-requests": FlagDoc(
        "max requests decoded together (the largest decode batch)",
        "N",
        "256, or fewer when the KV pool has fewer pages",
    ),
    "--max-total-tokens": FlagDoc(metavar="N", default="what the memory budget holds"),
    "--max-context-len": FlagDoc(
        "longest prompt + output of one request, in tokens; more than the model's max_position_embeddings is refused",
        "N",
        "the model's max_position_embeddings",
    ),
    "--mem-fraction-static": FlagDoc(metavar="F"),
    "--kv-budget-mb": FlagDoc(metavar="MIB"),
    "--cuda-graph-config": FlagDoc(default="built from the flags below"),
    "--cuda-graph-backend-decode": FlagDoc(
        "decode graphs: full (one graph per batch-size bucket) or disabled", default="full where graphs can run"
    ),
    "--cuda-graph-bs-decode": FlagDoc(default="1,2,4,8,12,16-256:8,... up to --cuda-graph-max-bs-decode"),
    "--cuda-graph-max-bs-decode": FlagDoc(
        "largest decode bucket of the default list", "N", "min(256, --max-running-requests)"
    ),
    "--cuda-graph-backend-prefill": FlagDoc(
        "prefill graphs: breakable (graphs between the attention breaks) or disabled",
        default="breakable where graphs can run",
    ),
    "--cuda-graph-num-tokens-prefill": FlagDoc(
        default="4-32:4,48-256:16,... up to --cuda-graph-max-num-tokens-prefill"
    ),
    "--cuda-graph-max-num-tokens-prefill": FlagDoc(
        "largest prefill bucket of the default list", "N", "--chunked-prefill-size"
    ),
    "--cuda-graph-max-padding-waste": FlagDoc(metavar="F", default="0.25"),
    "--synthetic-prompt-len": FlagDoc(
        "prompt lengths in tokens: fixed:N, uniform:LO:HI, lognormal:MEAN:SIGMA or choice:A,B,..."
    ),
    "--synthetic-output-len": FlagDoc("output lengths in tokens, in the forms of --synthetic-prompt-len"),
    "--seed": FlagDoc("seed of the synthetic workload; its request i samples with seed + i", "N"),
    "--max-new-tokens": FlagDoc("tokens generated per request unless a prompt line sets its own", "N"),
    "--temperature": FlagDoc("sampling temperature, >= 0 (0: greedy)", "T"),
    "--top-p": FlagDoc("nucleus sampling: keep the most likely tokens up to this probability mass, in (0, 1]", "P"),
    "--top-k": FlagDoc("keep the K most likely tokens (0: all)", "K"),
    "--theme": FlagDoc(metavar="NAME"),
    "--token": FlagDoc(metavar="TOKEN", default="$GRAPHTOP_TELEMETRY_TOKEN, or the entry graphtop ps reads"),
    "--phase": FlagDoc("which phase's list to advise"),
    "--max-graph-memory": FlagDoc(default="unbounded"),
}
"""What the flags' own ``add_argument`` lines leave out: help text, value format, default."""


def document(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Fill in ``FLAG_DOCS`` where a flag has no help, format or default; returns the parser."""
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or not action.option_strings:
            continue
        doc = FLAG_DOCS.get(action.option_strings[0])
        if doc is None:
            continue
        if not action.help:
            action.help = doc.help
        if doc.metavar and action.metavar is None and not action.choices and action.nargs != 0:
            action.metavar = doc.metavar
        if doc.default and "(default" not in (action.help or ""):
            action.help = f"{action.help} (default: {doc.default})"
    return parser


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the epilog's layout and says every flag's default (unless its text already does). A flag
    with aliases (``aliases.ALIASES``) shows its value's format once: ``--tp N, --tensor-parallel-size,
    --tp-size``."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        text = super()._format_action_invocation(action)
        if len(action.option_strings) < 2 or action.nargs == 0:
            return text
        return ", ".join([text.split(", ")[0], *action.option_strings[1:]])

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        shown = (
            default is not None
            and not isinstance(default, bool)
            and default is not argparse.SUPPRESS
            and "(default" not in text
        )
        if shown and action.option_strings and action.nargs != 0:
            text += " (default: %(default)s)"
        return text
