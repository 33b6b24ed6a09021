"""Every benchmark script imports by name (pytest's ``pythonpath`` holds ``bench``, as a script's own folder
is first on ``sys.path`` when it runs) and prints its ``--help`` without a GPU; every bench script the
docs, the README and the GPU scripts name exists, and every benchmark command the docs and the scripts'
usage lines quote parses with that script's own flags."""

from __future__ import annotations

import importlib
import re
import shlex

import pytest
from support.paths import BENCH, REPO, SCRIPTS

SCRIPT_NAMES = sorted(p.stem for p in BENCH.glob("*.py") if '__name__ == "__main__"' in p.read_text())
"""The scripts: the rest of bench/ (harness.py, host_sampler.py, ...) are helpers the scripts import."""
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
COMMAND = re.compile(r"(python3? bench/(\w+)\.py[^`\n]*)")  # to the end of its code span or line


def test_the_durable_benchmarks_are_there():
    assert {
        "graph_bench",
        "ab_decode",
        "profile_decode",
        "decode_attn_bench",
        "skinny_bench",
        "cpu_bench",
        "dashboard_bench",
        "parity_bench",
        "tp_bench",
        "cold_start_bench",
    } <= set(SCRIPT_NAMES)


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_every_bench_script_imports_and_prints_its_help(name, capsys):
    module = importlib.import_module(name)
    with pytest.raises(SystemExit) as exit_:
        module.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ")
    assert " ".join(module.__doc__.splitlines()[0].split()) in " ".join(out.split())  # the description


def test_every_named_bench_script_exists():
    texts = {p.name: p.read_text() for p in [*DOCS, *sorted(SCRIPTS.glob("*.sh"))]}
    named = {(doc, m) for doc, text in texts.items() for m in re.findall(r"\bbench/(\w+\.py)", text)}
    assert named, "no bench script named anywhere"
    missing = sorted((doc, script) for doc, script in named if not (BENCH / script).is_file())
    assert not missing


def quoted_commands() -> list[tuple[str, str, str]]:
    """Every benchmark command in the docs, the README and the scripts' own usage lines."""
    sources = [*DOCS, *(BENCH / f"{name}.py" for name in SCRIPT_NAMES)]
    return [(p.name, m.group(2), m.group(1)) for p in sources for m in COMMAND.finditer(p.read_text())]


@pytest.mark.parametrize("doc,name,command", quoted_commands())
def test_every_quoted_bench_command_parses(doc, name, command):
    """A command as quoted, its optional ``[...]`` parts included and a trailing ``# comment`` left out: an
    unknown flag or a bad value exits 2 here."""
    argv = shlex.split(re.sub(r"[\[\]]", " ", command), comments=True)[2:]
    importlib.import_module(name).parser().parse_args(argv)
