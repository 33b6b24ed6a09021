"""Shared pieces of the checkpoint-refusal tests: a private copy of the tiny checkpoint to damage, and
the one-line CheckpointError check (a helper module, not a conftest)."""

from __future__ import annotations

import shutil

import pytest

from graphtop.models import CheckpointError, load_checkpoint


@pytest.fixture
def ckpt(tiny_ckpt, tmp_path):
    """A copy of the tiny Llama checkpoint that a test may break without touching the session's."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_ckpt("llama"), folder)
    return folder


def load_error(path, **kwargs) -> str:
    """The CheckpointError loading ``path`` raises: one line, short enough to read, and a ValueError (what
    callers that know nothing of graphtop catch)."""
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path, **kwargs)
    message = str(info.value)
    assert "\n" not in message and len(message) < 400 and isinstance(info.value, ValueError), message
    return message


GGUF_PACKAGES = ("gguf", "accelerate")
"""What reading a .gguf needs (the ``gguf`` extra; the ``dev`` extra holds them too)."""


def require_gguf_packages() -> None:
    """Skip the calling test where the ``gguf`` extra is not installed: a test that reads a .gguf would
    otherwise fail on "reading GGUF needs the package(s) ...", which says nothing about what it tests."""
    for name in GGUF_PACKAGES:
        pytest.importorskip(name, reason=f"reading GGUF needs {name} (pip install -e '.[dev]')")
