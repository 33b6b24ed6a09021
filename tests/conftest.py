"""Shared fixtures: tiny HF checkpoints built once per session, and a CPU engine factory."""

from __future__ import annotations

import os
import signal

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pathlib import Path
from typing import Any, Callable

import pytest

# fixtures shared by several folders: private_cache_dir (cli_support), ckpt (load_support)
pytest_plugins = ["support.cli_support", "support.load_support"]


def pytest_configure(config: pytest.Config) -> None:
    # A background job of a non-interactive shell starts with SIGINT ignored, and Python keeps it ignored:
    # the tests of what Ctrl-C does need it delivered as a terminal delivers a user's.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-load",
        type=int,
        default=None,
        metavar="N",
        help="run the tests of tests/tui beside N spinning processes (default: $GRAPHTOP_TEST_CPU_LOAD, else 0)",
    )


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``tiny_ckpt(family, seed=0, **overrides)`` -> a tiny random checkpoint folder, built once per
    session per argument set (tests/support/tiny_models.py). Treat it as read-only: copy it to damage it."""
    from support.tiny_models import build_tiny_checkpoint

    cache: dict[str, Path] = {}

    def get(family: str, seed: int = 0, **overrides: Any) -> Path:
        key = repr((family, seed, sorted(overrides.items())))
        if key not in cache:
            root = tmp_path_factory.mktemp(f"ckpt-{family}")
            cache[key] = build_tiny_checkpoint(root, family, seed=seed, **overrides)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def make_engine() -> Callable[..., Any]:
    """``make_engine(path, bus=None, graphs=None, **engine_config)`` -> a small CPU fp32 Engine.

    Defaults keep construction cheap: a 4096-token pool, at most 8 running requests and 64-token
    prefill chunks (so the default lists are decode [1, 2, 4, 8] and prefill 4..32 step 4, 48, 64).
    ``graphs`` is a GraphConfig, or False for eager only. Graphs are captured before the engine
    serves (``capture_before_serving``), so tests about graphs see them from the first step; tests of
    serving while capturing pass ``capture_before_serving=False``.
    """
    from graphtop.engine.config import EngineConfig
    from graphtop.engine.engine import Engine
    from graphtop.engine.graphs.config import GraphConfig

    def make(path: Path, bus: Any = None, graphs: Any = None, **overrides: Any) -> Engine:
        if graphs is False:
            graphs = GraphConfig(decode_backend="disabled", prefill_backend="disabled")
        kwargs: dict[str, Any] = dict(
            device="cpu",
            dtype="float32",
            max_total_tokens=4096,
            max_running_requests=8,
            chunked_prefill_size=64,
            capture_before_serving=True,
        )
        kwargs.update(overrides)
        config = EngineConfig(graphs=graphs if graphs is not None else GraphConfig(), **kwargs)
        return Engine.from_pretrained(path, config=config, bus=bus)

    return make


@pytest.fixture
def torch_one_thread():
    """Run a test with one intra-op torch thread (restored afterwards): tiny models gain nothing
    from more, and on a shared 2-core machine OpenMP spinning makes them 5-10x slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
