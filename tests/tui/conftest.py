"""The dashboard's tests, optionally under a parallel CPU load (``pytest --cpu-load N tests/tui``;
tests/support/cpu_load.py says why)."""

from __future__ import annotations

from typing import Iterator

import pytest
from support.cpu_load import burners_asked, start_burners, stop_burners


@pytest.fixture(scope="package", autouse=True)
def cpu_load(request: pytest.FixtureRequest) -> Iterator[int]:
    """N spinning processes for as long as the tests of this folder run (none unless asked for)."""
    burners = start_burners(burners_asked(request.config.getoption("cpu_load")))
    try:
        yield len(burners)
    finally:
        stop_burners(burners)
