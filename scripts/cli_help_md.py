"""The generated blocks of docs/cli.md: the "Help text" block (``graphtop --help`` and every subcommand's,
at 100 columns) and the table of vLLM's and SGLang's flag names (``graphtop.cli.aliases``).

    python scripts/cli_help_md.py            print the help block
    python scripts/cli_help_md.py --write    put both into docs/cli.md between their markers

tests/cli/test_cli_help.py and tests/cli/test_cli_aliases.py check that docs/cli.md holds exactly these,
so they stay true: after changing a flag, an alias or a help text, run it with --write.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path

COMMANDS = (
    ["--help"],
    ["trace", "--help"],
    ["trace", "summary", "--help"],
    ["trace", "report", "--help"],
    ["trace", "export", "--help"],
    ["advise", "--help"],
    ["attach", "--help"],
    ["ps", "--help"],
    ["serve", "--help"],
    ["web", "--help"],
)
WIDTH = "100"
DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
START, END = "<!-- cli-help:start -->", "<!-- cli-help:end -->"
ALIAS_START, ALIAS_END = "<!-- cli-aliases:start -->", "<!-- cli-aliases:end -->"


def help_text(argv: list[str]) -> str:
    from graphtop.cli.entry import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main(argv)
        except SystemExit:
            pass
    return out.getvalue().rstrip("\n")


def markdown() -> str:
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH  # argparse wraps to the terminal's width
    try:
        blocks = [
            f"<details><summary><code>graphtop {' '.join(argv)}</code></summary>\n\n```text\n"
            f"{help_text(argv)}\n```\n\n</details>"
            for argv in COMMANDS
        ]
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before
    return "\n\n".join(blocks) + "\n"


def alias_markdown() -> str:
    from graphtop.cli.aliases import alias_table_md

    return alias_table_md()


def doc_block(text: str, start: str = START, end: str = END) -> str:
    """What docs/cli.md holds between the markers."""
    return text.split(start, 1)[1].split(end, 1)[0].strip("\n") + "\n"


def _replaced(text: str, start: str, end: str, block: str) -> str:
    head, rest = text.split(start, 1)
    tail = rest.split(end, 1)[1]
    return f"{head}{start}\n{block}{end}{tail}"


def write_doc() -> None:
    text = _replaced(DOC.read_text(), START, END, markdown())
    DOC.write_text(_replaced(text, ALIAS_START, ALIAS_END, alias_markdown()))


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write_doc()
    else:
        sys.stdout.write(markdown())
