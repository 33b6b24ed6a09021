"""The names vLLM and SGLang give graphtop's settings: one table, ``ALIASES``, that the parsers, the help
text and docs/cli.md are built from.

A command line written for ``vllm serve`` or ``python -m sglang.launch_server`` should run here unchanged
wherever graphtop has the same setting under a name of its own. Each alias names exactly one graphtop
flag and is added to that flag's option strings, so it sets the same value, and a bad value is refused
under every name in one line (``argument --max-context-len/--max-model-len/--context-length: ...``).
Flags graphtop already has under vLLM's or SGLang's own name (``--mem-fraction-static``,
``--max-running-requests``, ``--served-model-name``, ...) need no alias and are listed in ``SAME_NAMES``
for the docs.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Optional

from graphtop.engine.arguments import short_repr


@dataclass(frozen=True)
class Alias:
    """``name`` (another server's flag) sets graphtop's ``flag``; ``origin`` says whose name it is."""

    name: str
    flag: str
    origin: str


ALIASES: tuple[Alias, ...] = (
    Alias("--max-model-len", "--max-context-len", "vLLM"),
    Alias("--context-length", "--max-context-len", "SGLang"),
    Alias("--tensor-parallel-size", "--tp", "vLLM, SGLang"),
    Alias("--tp-size", "--tp", "SGLang"),
    Alias("--gpu-memory-utilization", "--mem-fraction-static", "vLLM"),
    Alias("--max-num-seqs", "--max-running-requests", "vLLM"),
    Alias("--enforce-eager", "--disable-cuda-graph", "vLLM"),
)

SAME_NAMES: tuple[tuple[str, str], ...] = (
    ("--mem-fraction-static", "SGLang"),
    ("--max-running-requests", "SGLang"),
    ("--disable-cuda-graph", "SGLang"),
    ("--chunked-prefill-size", "SGLang"),
    ("--max-total-tokens", "SGLang"),
    ("--dtype", "vLLM, SGLang"),
    ("--chat-template", "vLLM, SGLang"),
    ("--trust-remote-code", "vLLM, SGLang"),
    ("--seed", "vLLM, SGLang"),
    ("--served-model-name", "vLLM, SGLang"),
    ("--host", "vLLM, SGLang"),
    ("--port", "vLLM, SGLang"),
    ("--api-key", "vLLM, SGLang"),
    ("--disable-log-requests", "vLLM"),
)
"""Flags of ``graphtop serve`` that other servers' command lines use under the same name."""

DTYPES: dict[str, Optional[str]] = {
    "auto": None,
    "half": "float16",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "float": "float32",
    "float32": "float32",
}
"""``--dtype``'s values, vLLM's spelling included, as the engine names them (None: by device)."""


def names(flag: str) -> tuple[str, ...]:
    """``flag`` and every alias of it: the option strings of its ``add_argument``."""
    return (flag, *(a.name for a in ALIASES if a.flag == flag))


def dtype_value(text: str) -> Optional[str]:
    """``--dtype``: a name of ``DTYPES`` as the engine's dtype (None for ``auto``)."""
    try:
        return DTYPES[text]
    except KeyError:
        raise argparse.ArgumentTypeError(f"{short_repr(text)} is not one of {', '.join(DTYPES)}") from None


def alias_table_md() -> str:
    """The Markdown table of docs/cli.md (tests/cli/test_cli_aliases.py checks that it is there)."""
    rows = ["| flag | graphtop's flag | whose name |", "|---|---|---|"]
    rows += [f"| `{a.name}` | `{a.flag}` | {a.origin} |" for a in ALIASES]
    return "\n".join(rows) + "\n"
