"""Every example in README.md and docs/ runs as written on a CPU-only machine.

Fenced ```python and ```bash blocks are executed, each in a fresh folder with the installed package
(`graphtop` on PATH); ```console and ```text blocks are illustrations (the interactive dashboard, GPU
runs, servers) and are not. A page's reader copies a block and expects it to work: a block that
fails here is a documentation bug."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import REPO

FENCE = re.compile(r"^```(python|bash)\n(.*?)^```$", re.M | re.S)
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def examples() -> list:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for i, match in enumerate(FENCE.finditer(text)):
            line = text.count("\n", 0, match.start()) + 1
            found.append(pytest.param(match.group(1), match.group(2), id=f"{page.relative_to(REPO)}:{line}"))
    return found


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for every example: the demo model is built once, never in the user's own cache."""
    return tmp_path_factory.mktemp("graphtop-cache")


def test_the_pages_hold_examples() -> None:
    languages = {p.values[0] for p in examples()}
    assert languages == {"python", "bash"}, languages


@pytest.mark.parametrize(("language", "code"), examples())
def test_example_runs_as_written(language: str, code: str, tmp_path: Path, shared_cache: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRAPHTOP_CACHE_DIR": str(shared_cache)}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    if language == "python":
        script = tmp_path / "example.py"
        script.write_text(code, encoding="utf-8")
        argv = [sys.executable, str(script)]
    else:
        argv = ["bash", "-euo", "pipefail", "-c", code]
    run = subprocess.run(
        argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL
    )
    assert run.returncode == 0, (
        f"exit {run.returncode}\n--- stdout\n{run.stdout[-3000:]}\n--- stderr\n{run.stderr[-3000:]}"
    )
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
