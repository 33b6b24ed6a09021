"""graphtop's user cache: where built checkpoints (the demo model, GGUF conversions) live.

Every entry is a folder built in a staging folder beside it and renamed into place, so a folder
only ever appears complete: an interrupted build leaves nothing a later run could mistake for done.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from .paths import expand_user

CACHE_ENV = "GRAPHTOP_CACHE_DIR"
MARKER = "config.json"  # a complete checkpoint folder has one


def cache_root(cache_dir: Path | str | None = None) -> Path:
    """Explicit argument, else $GRAPHTOP_CACHE_DIR, else the platform user cache dir.

    Raises CheckpointError (one line) for a ``~user`` that cannot be expanded.
    """
    if cache_dir is not None:
        return expand_user(cache_dir, f"cache folder {cache_dir}")
    if os.environ.get(CACHE_ENV):
        return expand_user(os.environ[CACHE_ENV], f"{CACHE_ENV}={os.environ[CACHE_ENV]}")
    import platformdirs

    return Path(platformdirs.user_cache_dir("graphtop"))


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """``target``, built by ``build(staging_folder)`` unless it is already complete."""
    if (target / MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.building-", dir=target.parent))
    try:
        build(staging)
        if target.exists() and not (target / MARKER).is_file():
            shutil.rmtree(target, ignore_errors=True)  # not ours to trust: incomplete
        try:
            os.rename(staging, target)
        except OSError:
            if not (target / MARKER).is_file():
                raise  # a concurrent builder that won the race leaves an identical folder
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


@contextmanager
def no_progress_bars() -> Iterator[None]:
    """transformers' own progress bars off: the dashboard or the headless progress owns the terminal."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
