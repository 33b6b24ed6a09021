"""The "Help text" block of docs/cli.md: ``graphtop --help`` and every subcommand's, at 100 columns.

    python scripts/cli_help_md.py            print it
    python scripts/cli_help_md.py --write    put it into docs/cli.md between the cli-help markers

tests/cli/test_cli_help.py checks that docs/cli.md holds exactly this, so its help texts stay true:
after changing a flag or a help text, run it with --write.
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
    ["trace", "export", "--help"],
    ["advise", "--help"],
    ["attach", "--help"],
    ["ps", "--help"],
    ["serve", "--help"],
)
WIDTH = "100"
DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
START, END = "<!-- cli-help:start -->", "<!-- cli-help:end -->"


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


def doc_block(text: str) -> str:
    """What docs/cli.md holds between the markers."""
    return text.split(START, 1)[1].split(END, 1)[0].strip("\n") + "\n"


def write_doc() -> None:
    text = DOC.read_text()
    head, rest = text.split(START, 1)
    tail = rest.split(END, 1)[1]
    DOC.write_text(f"{head}{START}\n{markdown()}{END}{tail}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write_doc()
    else:
        sys.stdout.write(markdown())
