"""Which kernel variants one configuration's graphs launch, kept beside the compiled kernels.

Why: finding a bucket's variants takes a dry run of its forward, which costs a forward's GPU work (a
large prefill bucket of an 8B model, a good part of a second). A start whose configuration was captured
before reads the list instead, checks each variant is on disk, and captures at once: a warm start does
no dry run at all. The file is named by a hash of everything that decides the variants (the engine's
setup, the bucket list, the kernel sources, Triton's version), so a change of any of them starts a new
list; a list that is wrong anyway only makes a capture compile what it misses, as without precompile.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from .precompile import KernelVariant

__all__ = ["VariantManifest", "kernel_sources_hash"]

FOLDER = "graphtop-manifests"
_sources: Optional[str] = None


def kernel_sources_hash() -> str:
    """A hash of this package's kernel sources (computed once a process)."""
    global _sources
    if _sources is None:
        digest = hashlib.sha256()
        for path in sorted(Path(__file__).parent.glob("*.py")):
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
        _sources = digest.hexdigest()
    return _sources


class VariantManifest:
    """The variants of one phase of one configuration: read at start, written after a capture found them."""

    def __init__(self, cache_folder: Path, phase: str, setup: str, buckets: list[int]) -> None:
        try:
            import triton

            version = triton.__version__
        except Exception:  # pragma: no cover - depends on the install
            version = "none"
        key = json.dumps([setup, sorted(buckets), kernel_sources_hash(), version])
        name = f"{phase}-{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"
        self.path = cache_folder / FOLDER / name
        self.variants = self._read()

    def _read(self) -> list[KernelVariant]:
        """The stored variants; none for a missing or unreadable file (the dry runs then find them)."""
        try:
            return [KernelVariant(**v) for v in json.loads(self.path.read_text())["variants"]]
        except (OSError, ValueError, KeyError, TypeError):
            return []

    def save(self, variants: list[KernelVariant]) -> bool:
        """Write ``variants`` (atomically: a reader sees the old file or the new one). False where the
        folder cannot be written (a read-only cache keeps its dry runs)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, staged = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        except OSError:
            return False
        try:
            with os.fdopen(fd, "w") as out:
                json.dump({"variants": [asdict(v) for v in variants]}, out)
            os.replace(staged, self.path)
        except OSError:
            Path(staged).unlink(missing_ok=True)
            return False
        self.variants = list(variants)
        return True
