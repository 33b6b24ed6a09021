"""Which buckets of a graph runner have every kernel their forward launches compiled, so capturing them
compiles nothing on the step thread.

A bucket's kernels are found by a dry run of its forward (``models.kernels.precompile.record_missing``:
variants not compiled here are recorded, not compiled or launched) and handed to the compiler's worker
processes. A capture job asks ``ready`` before each bucket and leaves the bucket for a later slice while
its kernels compile; meanwhile it dry-runs the buckets after it (``look_ahead``), so the workers compile
every bucket's kernels in parallel while the engine serves eagerly. Once a first capture has found them,
the phase's variants are kept in a manifest (``models/kernels/manifest.py``): a later start with the same
configuration submits those instead of dry-running, and every bucket waits for all of them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional, Protocol

from graphtop.models.kernels.compile_pool import KernelCompiler
from graphtop.models.kernels.manifest import VariantManifest
from graphtop.models.kernels.precompile import KernelVariant, record_missing

__all__ = ["BucketGate", "KernelGate", "Precompile"]


@dataclass(frozen=True)
class Precompile:
    """What an engine hands its model runner to compile kernels ahead of capture: the compiler, and where
    and under which setup (everything else that decides the variants) a phase's manifest is kept."""

    compiler: KernelCompiler
    cache_folder: Path
    setup: str

    def gate(self, phase: str, buckets: list[int], dry_run: Callable[[int], None]) -> "KernelGate":
        return KernelGate(self.compiler, dry_run, VariantManifest(self.cache_folder, phase, self.setup, buckets))


class BucketGate(Protocol):
    """What a capture job asks before capturing a bucket."""

    def ready(self, bucket: int) -> bool:
        """Whether ``bucket`` can be captured now without compiling; never blocks."""
        ...

    def ready_without_running(self, bucket: int) -> bool:
        """``ready(bucket)`` where knowing needs nothing run on the device; False where it needs a dry run
        (a step may be in flight: runners/capture.py)."""
        ...

    def wait(self, bucket: int) -> None:
        """Block until ``ready(bucket)`` (an engine that captures before serving)."""
        ...

    def look_ahead(self, buckets: Iterable[int], deadline: float, limit: Optional[int] = None) -> None:
        """Find the kernels of ``buckets`` (in order) until ``deadline`` (``time.perf_counter``), dry-running
        at most ``limit`` of them (None: no limit)."""
        ...

    def kernel_counts(self) -> tuple[int, int]:
        """(compiled by the workers, loaded from the cache folder) of the kernels its buckets launch."""
        ...

    def finish(self, ok: bool) -> None:
        """The capture job is over (``ok``: every bucket captured)."""
        ...


class KernelGate:
    """A ``BucketGate`` over a compiler: ``dry_run(bucket)`` runs the bucket's forward as its capture would."""

    def __init__(
        self, compiler: KernelCompiler, dry_run: Callable[[int], None], manifest: Optional[VariantManifest] = None
    ) -> None:
        self.compiler = compiler
        self.dry_run = dry_run
        self.manifest = manifest
        self._known: Optional[list[str]] = None  # the manifest's keys, once submitted
        self._use_manifest = manifest is not None and bool(manifest.variants)
        self._found: dict[str, KernelVariant] = {}  # what this process's dry runs found
        self._keys: dict[int, list[str]] = {}
        self.failures: list[str] = []
        """Buckets whose dry run failed: they are captured as without a gate (the capture compiles)."""

    def _discover(self, bucket: int) -> list[str]:
        keys = self._keys.get(bucket)
        if keys is None and self._use_manifest:
            assert self.manifest is not None
            if self._known is None:
                self._known = self.compiler.submit(self.manifest.variants)
            keys = self._keys[bucket] = self._known
        if keys is None:
            try:
                with record_missing() as missing:
                    self.dry_run(bucket)
                keys = self.compiler.submit(missing)
                self._found.update((v.key, v) for v in missing)
            except Exception as e:  # e.g. a Triton whose hook data differs: never worse than no gate
                self.failures.append(f"bucket {bucket}: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
                keys = []
            self._keys[bucket] = keys
        return keys

    def ready(self, bucket: int) -> bool:
        return self.compiler.done(self._discover(bucket))

    def ready_without_running(self, bucket: int) -> bool:
        if bucket not in self._keys and not self._use_manifest:
            return False  # its kernels are found by a dry run
        return self.ready(bucket)

    def wait(self, bucket: int) -> None:
        self.compiler.wait(self._discover(bucket))

    def look_ahead(self, buckets: Iterable[int], deadline: float, limit: Optional[int] = None) -> None:
        runs = 0
        for bucket in buckets:
            if bucket in self._keys:
                continue
            if time.perf_counter() >= deadline or (limit is not None and runs >= limit):
                return
            self._discover(bucket)
            runs += 1

    def kernel_counts(self) -> tuple[int, int]:
        counts = self.compiler.origins(k for keys in self._keys.values() for k in keys)
        return counts["compiled"], counts["disk"]

    def finish(self, ok: bool) -> None:
        """Keep what the dry runs found for the next start, after a capture where every bucket went live."""
        if ok and self.manifest is not None and not self._use_manifest and self._found and not self.failures:
            self.manifest.save(list(self._found.values()))

    def forget(self) -> None:
        """A recapture: its lists may differ from the manifest's, so its buckets are dry-run (and what they
        find is not the manifest's to keep)."""
        self._keys.clear()
        self._use_manifest = False
        self.manifest = None
