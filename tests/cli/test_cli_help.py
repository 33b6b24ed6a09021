"""The command line explains itself: every subcommand listed with examples, every flag with its
meaning, format and default, ``graphtop trace`` alone prints its help, ``trace export`` needs no
format flag, and every error has one form."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from support.paths import SCRIPTS

from graphtop.cli.advise import build_advise_parser
from graphtop.cli.entry import (
    build_attach_parser,
    build_parser,
    build_ps_parser,
    build_trace_parser,
    main,
)
from graphtop.cli.flags import _Parser
from graphtop.cli.help_text import COMMANDS
from graphtop.cli.serve import build_serve_parser
from graphtop.cli.web import build_web_parser
from graphtop.engine.telemetry.trace_writer import write_trace
from graphtop.tui.sessions.fake import boot_events, step_events

MODE_SWITCHES = {
    "--prompts",
    "--output",
    "--record",
    "--synthetic",
    "--replay",
    "--cuda-graph-config",
    "--serve",
    "--dashboard",
}
"""Flags whose absence is the default (a mode not chosen); their help says what they turn on."""


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as exc:  # --help exits through argparse
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def all_parsers() -> list[argparse.ArgumentParser]:
    trace = build_trace_parser()
    subs = next(a for a in trace._actions if isinstance(a, argparse._SubParsersAction))
    return [
        build_parser(),
        build_attach_parser(),
        build_ps_parser(),
        build_advise_parser(_Parser),
        trace,
        build_serve_parser(),
        build_web_parser(),
        *subs.choices.values(),
    ]


def test_top_level_help_lists_every_subcommand_with_a_line_and_examples(capsys) -> None:
    rc, out, err = run(capsys, "--help")
    assert rc == 0 and err == ""
    assert "graphtop {trace,advise,attach,ps,serve,web}" in out
    for command, what in COMMANDS:
        assert f"  {command}" in out and what in out
    examples = out.split("examples:")[1]
    for name in ("trace summary", "trace export", "advise", "attach", "--replay", "--prompts", "--synthetic", "serve"):
        assert f"graphtop {name}" in examples
    assert "examples:" in out and "graphtop: error:" in out
    assert max(len(line) for line in out.split("commands (")[1].splitlines()) < 80


def test_every_flag_has_help_a_format_and_its_default() -> None:
    for parser in all_parsers():
        text = parser.format_help()
        for action in parser._actions:
            if action.help == argparse.SUPPRESS or isinstance(
                action, (argparse._HelpAction, argparse._SubParsersAction)
            ):
                continue
            name = action.option_strings[0] if action.option_strings else action.dest
            assert action.help, f"{parser.prog} {name}: no help"
            if action.nargs == 0:
                continue  # a switch: its help says what it does
            assert action.metavar or action.choices or not action.option_strings, f"{name}: no format"
            line = parser._get_formatter()._format_action(action)
            if action.option_strings and name not in MODE_SWITCHES:
                assert "default" in line, f"{parser.prog} {name}: no default in {line!r}"
        assert text


def test_graphtop_trace_alone_prints_its_help(capsys) -> None:
    rc, out, err = run(capsys, "trace")
    assert rc == 0 and err == ""
    assert "summary" in out and "export" in out and "graphtop trace export run.jsonl run.json" in out


def test_trace_export_defaults_to_perfetto_and_still_takes_the_flag(tmp_path: Path, capsys) -> None:
    trace = tmp_path / "run.jsonl"
    write_trace(str(trace), boot_events() + step_events(10), meta={"source": "test"})
    for extra in ((), ("--perfetto",)):
        out_file = tmp_path / f"out{len(extra)}.json"
        rc, out, err = run(capsys, "trace", "export", *extra, trace, out_file)
        assert rc == 0 and err == "" and f"wrote {out_file}" in out
        assert json.loads(out_file.read_text())["traceEvents"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--bogus"],
        ["--replay", "/nope/run.jsonl"],
        ["trace", "summary", "/nope/run.jsonl"],
        ["trace", "summary"],
        ["trace", "export", "only-one-arg.jsonl"],
        ["advise", "/nope/run.jsonl"],
        ["ps", "extra"],
        ["attach"],
        ["--page-size", "0"],
        *([flag, ""] for flag in ("--replay", "--prompts", "--output", "--record", "--model")),
        ["trace", "summary", ""],
        ["trace", "export", "run.jsonl", ""],
        ["advise", ""],
    ],
)
def test_every_error_has_one_form(argv, capsys, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("GRAPHTOP_RUNTIME_DIR", str(tmp_path / "runtime"))  # no engine to attach to
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == ""
    assert err.startswith("graphtop: error: ") and err.count("\n") == 1, err


def test_replay_with_an_unknown_theme_is_one_error_line(tmp_path: Path, capsys) -> None:
    trace = tmp_path / "run.jsonl"
    write_trace(str(trace), boot_events(), meta={})
    rc, out, err = run(capsys, "--replay", trace, "--theme", "no-such-theme")
    assert rc == 2 and err.startswith("graphtop: error: unknown theme 'no-such-theme'") and err.count("\n") == 1


def test_docs_cli_holds_the_current_help_texts() -> None:
    import importlib.util

    script = SCRIPTS / "cli_help_md.py"
    spec = importlib.util.spec_from_file_location("cli_help_md", script)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    doc = module.DOC.read_text()
    for argv in module.COMMANDS:
        assert f"<code>graphtop {' '.join(argv)}</code>" in doc
    assert module.doc_block(doc) == module.markdown(), (
        "docs/cli.md's help text is stale: run python scripts/cli_help_md.py --write"
    )


def test_an_empty_path_is_refused_not_read_as_no_flag(capsys) -> None:
    """``--prompts ''`` used to open the dashboard (an empty string is falsy) instead of a headless run."""
    rc, out, err = run(capsys, "--prompts", "", "--max-new-tokens", "2")
    assert rc == 2 and err.strip() == "graphtop: error: argument --prompts: an empty path"


@pytest.mark.parametrize("flag, what", [("--telemetry", "address"), ("--cuda-graph-config", "JSON config")])
def test_an_empty_address_or_graph_config_is_refused_not_read_as_no_flag(capsys, flag, what) -> None:
    """``--telemetry ''`` ran without an endpoint and ``--cuda-graph-config ''`` with the default graphs,
    both without a word (an empty string is falsy)."""
    rc, out, err = run(capsys, "--synthetic", "2", flag, "")
    assert rc == 2 and out == "" and err.strip() == f"graphtop: error: argument {flag}: an empty {what}"


def test_the_dashboard_without_a_terminal_is_one_error_line(tmp_path: Path, capsys) -> None:
    """Under pytest stdin and stdout are not terminals: a replay would spin Textual's input thread on
    them and outlive SIGTERM; it is refused once the trace has been read."""
    trace = tmp_path / "run.jsonl"
    write_trace(str(trace), boot_events(), meta={})
    rc, out, err = run(capsys, "--replay", trace)
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("graphtop: error: the dashboard needs a terminal, but stdin and stdout are not one")
