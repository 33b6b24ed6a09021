"""``pytest --cpu-load N tests/tui``: N burners spin while this folder's tests run, and stop with it."""

from __future__ import annotations

import psutil
import pytest
from support.cpu_load import MAX_BURNERS, burners_asked


def test_the_asked_load_runs_beside_the_dashboards_tests(cpu_load: int, request: pytest.FixtureRequest) -> None:
    assert cpu_load == burners_asked(request.config.getoption("cpu_load")) <= MAX_BURNERS
    spinning = [p for p in psutil.Process().children() if "200_000" in " ".join(p.cmdline())]
    assert len(spinning) == cpu_load and all(p.is_running() for p in spinning)
