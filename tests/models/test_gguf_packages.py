"""The README's install runs the GGUF tests, and a venv without the ``gguf`` extra skips them cleanly.

``pip install -e ".[dev]"`` is what a newcomer runs before the test command: the ``dev`` extra holds
every package the ``gguf`` extra names, and CI installs exactly that. Where those packages are missing
anyway, every test that reads a .gguf skips instead of failing on "reading GGUF needs the package(s)".
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from support.paths import REPO

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

GGUF_TESTS = ["tests/models/test_models_gguf.py", "tests/models/test_load_refusals_gguf.py"]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower()


def test_the_dev_extra_holds_the_gguf_extra():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {_name(r) for r in extras["gguf"]} <= {_name(r) for r in extras["dev"]}


def test_ci_installs_what_the_readme_says():
    """CI must meet what a newcomer meets: an extra CI adds would hide a test that fails without it."""
    installs = re.findall(r"pip install -q -e (\S+)", (REPO / ".ci" / "run").read_text())
    assert installs == ['".[dev]"']


def test_without_the_gguf_packages_the_gguf_tests_skip(tmp_path):
    """Both packages hidden (``sys.modules[name] = None``: import fails and ``find_spec`` says None, as in a
    venv without them): the GGUF test files pass with skips, no failure."""
    code = (
        "import sys\nfor name in ('gguf', 'accelerate'):\n    sys.modules[name] = None\n"
        "import pytest\nsys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-rs', *sys.argv[1:]]))\n"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", GRAPHTOP_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run(
        [sys.executable, "-c", code, *GGUF_TESTS], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "failed" not in proc.stdout and "skipped" in proc.stdout
    assert "needs the package(s)" not in proc.stdout
