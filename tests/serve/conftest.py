"""Fixtures of the HTTP API tests: the demo model built once into a private cache, and one server on it
shared by a module's tests (each test leaves the engine idle)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
from support.serve_support import Served, serving


@pytest.fixture(scope="session")
def demo_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache folder holding the demo model (built once per test run, never in the user's cache)."""
    from graphtop.models.synthetic.demo import ensure_demo_model

    root = tmp_path_factory.mktemp("serve-cache")
    ensure_demo_model(root)
    return root


@pytest.fixture(scope="session")
def demo_model(demo_cache: Path) -> Path:
    from graphtop.models.synthetic.demo import DEMO_DIRNAME

    return demo_cache / DEMO_DIRNAME


@pytest.fixture(scope="module")
def served(demo_model: Path) -> Iterator[Served]:
    with serving(demo_model) as s:
        yield s
