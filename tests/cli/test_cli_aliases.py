"""vLLM's and SGLang's flag names: every alias of ``graphtop.cli.aliases.ALIASES`` sets exactly the value its
graphtop flag sets, on ``graphtop serve`` and the main command; abbreviations are refused; ``--dtype``
takes vLLM's spellings; ``graphtop serve MODEL`` is ``--model MODEL``; and docs/cli.md holds the table."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest
from support.cli_support import assert_usage_error, run
from support.paths import SCRIPTS

from graphtop.cli.aliases import ALIASES, DTYPES, SAME_NAMES, alias_table_md, names
from graphtop.cli.entry import build_parser
from graphtop.cli.flags import engine_config_from_args
from graphtop.cli.serve import build_serve_parser, read_serve_args

VALUES = {
    "--max-context-len": "64",
    "--tp": "2",
    "--mem-fraction-static": "0.5",
    "--max-running-requests": "3",
    "--disable-cuda-graph": None,
}
"""A value for each graphtop flag that has aliases (None: a switch)."""


def _argv(flag: str) -> list[str]:
    value = VALUES[flag]
    return [flag] if value is None else [flag, value]


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    return parser.parse_args(argv)


def test_the_table_maps_each_alias_onto_one_flag_and_every_flag_has_a_test_value() -> None:
    aliases = [a.name for a in ALIASES]
    assert len(aliases) == len(set(aliases)), "an alias named twice"
    assert not set(aliases) & {a.flag for a in ALIASES}, "an alias that is also a graphtop flag"
    assert {a.flag for a in ALIASES} == set(VALUES)
    for parser in (build_parser(), build_serve_parser()):
        strings = {s: action for action in parser._actions for s in action.option_strings}
        for alias in ALIASES:
            assert strings[alias.name] is strings[alias.flag], f"{alias.name} is not {alias.flag}"


@pytest.mark.parametrize("alias", ALIASES, ids=[a.name for a in ALIASES])
@pytest.mark.parametrize("parser", [build_parser, build_serve_parser], ids=["graphtop", "serve"])
def test_every_alias_sets_what_its_flag_sets(alias, parser) -> None:
    ours = _parse(parser(), _argv(alias.flag))
    theirs = _parse(parser(), [alias.name, *_argv(alias.flag)[1:]])
    assert vars(ours) == vars(theirs)
    assert engine_config_from_args(ours) == engine_config_from_args(theirs)
    assert vars(ours) != vars(_parse(parser(), [])), f"{alias.flag}'s test value is its default"


@pytest.mark.parametrize("alias", [a for a in ALIASES if VALUES[a.flag] is not None], ids=lambda a: a.name)
def test_a_bad_value_under_an_alias_is_one_line_naming_every_spelling(alias, capsys, tmp_path) -> None:
    line = assert_usage_error(*run(capsys, "serve", str(tmp_path), alias.name, "nan"))
    assert all(name in line for name in names(alias.flag)), line


def test_vllm_and_sglang_dtype_names(capsys, tmp_path) -> None:
    for text, dtype in DTYPES.items():
        args = read_serve_args(["--dtype", text])
        assert args.dtype == dtype and engine_config_from_args(args).dtype == dtype
    assert DTYPES["half"] == "float16" and DTYPES["float"] == "float32" and DTYPES["auto"] is None
    assert_usage_error(*run(capsys, "serve", str(tmp_path), "--dtype", "fp8"), "--dtype", "'fp8'", "half")


def test_abbreviations_are_refused_on_every_parser(capsys, tmp_path) -> None:
    from test_cli_help import all_parsers

    assert all(not p.allow_abbrev for p in all_parsers())
    for argv in (
        ["serve", str(tmp_path), "--mem-fraction", "0.5"],
        ["--mem-fraction", "0.5", "--synthetic", "1"],
        ["serve", str(tmp_path), "--max-model", "64"],
        ["advise", str(tmp_path / "t.jsonl"), "--max-graph", "4"],
    ):
        assert_usage_error(*run(capsys, *argv), "unrecognized arguments")


def test_serve_takes_the_model_as_a_positional_argument(capsys, tmp_path) -> None:
    model = str(tmp_path / "m")
    assert read_serve_args([model, "--port", "0"]).model == model
    assert read_serve_args(["--port", "0", model]).model == model
    assert read_serve_args([model, "--model", model]).model == model
    assert read_serve_args([]).model is None
    assert_usage_error(*run(capsys, "serve", model, "--model", str(tmp_path / "other")), "two models")


def test_trust_remote_code_is_accepted_and_changes_nothing() -> None:
    plain, trusting = read_serve_args([]), read_serve_args(["--trust-remote-code"])
    assert trusting.trust_remote_code and engine_config_from_args(plain) == engine_config_from_args(trusting)
    action = next(a for a in build_serve_parser()._actions if "--trust-remote-code" in a.option_strings)
    assert "does nothing" in action.help
    assert build_parser().parse_args(["--trust-remote-code"]).trust_remote_code


TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"


def test_a_chat_template_from_a_file_or_as_text_reaches_the_engine_config(capsys, tmp_path) -> None:
    file = tmp_path / "template.jinja"
    file.write_text(TEMPLATE)
    for value in (str(file), TEMPLATE):
        assert engine_config_from_args(read_serve_args(["--chat-template", value])).chat_template == TEMPLATE
    assert engine_config_from_args(read_serve_args([])).chat_template is None
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}")
    for value, needle in (
        ("chatml", "neither a file nor a Jinja template"),
        (str(broken), "not valid Jinja"),
        ("{{ unclosed", "not valid Jinja"),
    ):
        assert_usage_error(*run(capsys, "serve", str(tmp_path), "--chat-template", value), "--chat-template", needle)


def test_the_engine_uses_the_given_chat_template(tiny_ckpt, make_engine, torch_one_thread) -> None:
    from graphtop.engine.prompts import has_chat_template

    engine = make_engine(tiny_ckpt("qwen3"), graphs=False, chat_template=TEMPLATE)
    try:
        assert has_chat_template(engine.tokenizer) and engine.tokenizer.chat_template == TEMPLATE
        handle = engine.submit([{"role": "user", "content": "hi"}], chat=True)  # encoded at submit
        assert engine.tokenizer.decode(handle.prompt_ids).endswith("<user>hi<assistant>")
    finally:
        engine.close()


def test_docs_cli_holds_the_alias_table() -> None:
    spec = importlib.util.spec_from_file_location("cli_help_md", SCRIPTS / "cli_help_md.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    doc = module.DOC.read_text()
    assert module.doc_block(doc, module.ALIAS_START, module.ALIAS_END) == alias_table_md(), (
        "docs/cli.md's alias table is stale: run python scripts/cli_help_md.py --write"
    )
    for name, _ in SAME_NAMES:
        assert f"`{name}" in doc, f"docs/cli.md does not mention {name}"
    assert Path(module.DOC).name == "cli.md"
