"""Where the SmolLM2-135M-Instruct GGUF is, for the tests that run the real model (skipped without it)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from support.paths import SCRIPTS

GGUF_ENV = "GRAPHTOP_SMOLLM2_GGUF"
SCRIPT = SCRIPTS / "fetch_smollm2.py"


def smollm2_gguf() -> Path:
    """``$GRAPHTOP_SMOLLM2_GGUF``, else where ``scripts/fetch_smollm2.py`` puts it (fetched or not)."""
    if os.environ.get(GGUF_ENV):
        return Path(os.environ[GGUF_ENV]).expanduser()
    spec = importlib.util.spec_from_file_location("fetch_smollm2", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.gguf_path()
