"""Every test under tests/cuda needs a CUDA device: marked ``cuda`` (``-m cuda`` selects them, as
scripts/gpu_check.sh does) and skipped where torch sees none."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_device = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if HERE in Path(item.fspath).parents:
            item.add_marker(pytest.mark.cuda)
            if not torch.cuda.is_available():
                item.add_marker(no_device)
