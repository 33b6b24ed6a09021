"""Compiling Triton kernel variants ahead of their first launch, in other processes, into a cache that persists.

Why: a cold Triton compile takes a second or more per kernel variant, and a variant compiles on its first
launch, on the thread that launches it: the engine's step thread, during a capture slice. On a fresh
machine that stalled serving for seconds per bucket. Triton names what a launch would compile before it
compiles it (``knobs.runtime.jit_cache_hook``, with the variant's specialization as JSON, the data its
own ``JITFunction.preload`` takes), and it compiles for an explicit target without a GPU. So: a dry
forward records the variants a shape misses without compiling or launching any of them
(``record_missing``), worker processes compile them into Triton's on-disk cache (``compile_variant``),
and the launch that follows finds them there and only loads them.

The cache is graphtop's (``point_triton_cache``), so a second start loads every variant from disk.
This module leans on Triton's specialization JSON and cache key; ``supported`` says whether the
installed Triton has them.
"""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import Future, wait
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

try:
    import triton
    from triton import knobs

    HAVE_TRITON = True
except Exception:  # pragma: no cover - depends on the install
    HAVE_TRITON = False

__all__ = [
    "KernelVariant",
    "compile_variant",
    "is_cached",
    "join_in_flight",
    "leave",
    "point_triton_cache",
    "record_missing",
    "supported",
    "triton_cache_dir",
]

CACHE_ENV = "TRITON_CACHE_DIR"
Hook = Callable[..., Optional[bool]]


@dataclass(frozen=True)
class KernelVariant:
    """One compile of one kernel: the kernel by module and name (a worker imports it) and Triton's own
    description of the specialization (signature, constexprs, attributes, options, target) as JSON."""

    module: str
    name: str
    specialization: str

    @property
    def key(self) -> str:
        """Triton's in-memory cache key of the variant: equal keys compile to the same binary."""
        return f"{self.module}:{self.name}:{json.loads(self.specialization)['key']}"

    @property
    def label(self) -> str:
        return f"{self.module.rsplit('.', 1)[-1]}.{self.name}"


def supported() -> bool:
    """Whether the installed Triton names a variant before compiling it and can compile it elsewhere."""
    return HAVE_TRITON and hasattr(knobs, "runtime") and hasattr(knobs.runtime, "jit_cache_hook")


def triton_cache_dir() -> Optional[str]:
    return str(knobs.cache.dir) if HAVE_TRITON else None


def point_triton_cache(folder: Path) -> Optional[Path]:
    """Keep compiled kernels in ``folder`` (graphtop's cache), unless the user chose Triton's cache folder
    ($TRITON_CACHE_DIR wins). Returns the folder in use. Set in this process and in the environment
    that worker processes inherit. A folder that cannot be written (a read-only cache) is left alone:
    Triton keeps its own default."""
    if not HAVE_TRITON:
        return None
    chosen = os.environ.get(CACHE_ENV)
    path = Path(chosen) if chosen else folder
    if not chosen:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError:
            return None
        if not os.access(path, os.W_OK):
            return None
    os.environ[CACHE_ENV] = str(path)
    knobs.cache.dir = str(path)
    return path


_recording = threading.local()


@contextmanager
def record_missing() -> Iterator[list[KernelVariant]]:
    """Within the block, on this thread, a launch of a kernel variant that is not compiled in this process
    is recorded instead of compiled, and does not run: the block is a dry run whose outputs are garbage.
    Yields the list the variants are appended to (each once). Launches of compiled variants run as usual."""
    found: list[KernelVariant] = []
    seen: set[str] = set()
    previous = knobs.runtime.jit_cache_hook

    def hook(*, fn: Any, compile: dict[str, Any], **_: Any) -> Optional[bool]:
        if getattr(_recording, "active", None) is not found:  # another thread's launch: compile as usual
            return previous(fn=fn, compile=compile, **_) if previous is not None else None
        variant = KernelVariant(fn.module, fn.name, with_target(compile["specialization_data"]))
        if variant.key not in seen:
            seen.add(variant.key)
            found.append(variant)
        return True  # skip the compile and the launch

    knobs.runtime.jit_cache_hook = hook
    _recording.active = found
    try:
        yield found
    finally:
        _recording.active = None
        knobs.runtime.jit_cache_hook = previous


def with_target(specialization: str) -> str:
    """Triton's specialization JSON with the target it compiles for: Triton 3.7+ writes it in, 3.6 leaves it
    out (a worker without a GPU could not ask its driver), so it is added here from this process's driver."""
    data = json.loads(specialization)
    if "target" in data:
        return specialization
    from triton.runtime.driver import driver

    data["target"] = driver.active.get_current_target().__dict__
    return json.dumps(data)


def join_in_flight(in_flight: Callable[[str], Optional[Future[float]]]) -> Hook:
    """From now on, a launch (outside ``record_missing``) of a variant that a worker is compiling waits for
    that worker and then loads its result, instead of compiling it a second time beside it: an eager step
    of a shape whose kernels are on their way waits less than a compile. Returns the installed hook
    (``leave`` removes it)."""
    previous = knobs.runtime.jit_cache_hook

    def hook(*, fn: Any, compile: dict[str, Any], **rest: Any) -> Optional[bool]:
        future = in_flight(KernelVariant(fn.module, fn.name, compile["specialization_data"]).key)
        if future is not None and not future.done():
            wait([future])
        return previous(fn=fn, compile=compile, **rest) if previous is not None else None

    hook.previous = previous  # type: ignore[attr-defined]
    knobs.runtime.jit_cache_hook = hook
    return hook


def leave(hook: Hook) -> None:
    """Put back the hook ``hook`` replaced, if ``hook`` is still the one installed (a later one stays)."""
    if knobs.runtime.jit_cache_hook is hook:
        knobs.runtime.jit_cache_hook = getattr(hook, "previous", None)


def _jit_function(variant: KernelVariant) -> Any:
    """The kernel's ``JITFunction`` (under any autotuner or heuristics wrapper)."""
    import importlib

    fn = getattr(importlib.import_module(variant.module), variant.name.split(".")[-1])
    while not isinstance(fn, triton.runtime.jit.JITFunction):
        fn = fn.fn
    return fn


def _source(variant: KernelVariant) -> tuple[Any, Any, Any, dict[str, Any]]:
    """(ASTSource, GPUTarget, its backend, options) for ``variant``, decoded as ``JITFunction.preload``
    decodes it."""
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import convert_to_tuple_if_list

    data = json.loads(variant.specialization)
    target = GPUTarget(**{k: tuple(v) if isinstance(v, list) else v for k, v in data["target"].items()})
    backend = make_backend(target)

    def constant(value: Any) -> Any:
        if tl.dtype.is_dtype(value):
            return tl.dtype(value)
        if isinstance(value, dict) and "constexpr" in value:
            return tl.constexpr(convert_to_tuple_if_list(value["constexpr"]))
        if isinstance(value, dict) and "jit_function" in value:  # Triton 3.7+ names JITFunction constants so
            from triton.runtime.jit import _triton_jit_function_registry

            return _triton_jit_function_registry[value["jit_function"]]
        return convert_to_tuple_if_list(value)

    constexprs = {tuple(k): constant(v) for k, v in zip(data["constant_keys"], data["constant_vals"])}
    attrs = dict(zip(map(tuple, data["attrs_keys"]), data["attrs_vals"]))
    signature = {k: convert_to_tuple_if_list(v) for k, v in data["signature"].items()}
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in data["options"].items()}
    source = ASTSource(_jit_function(variant), signature, constexprs, attrs)
    return source, target, backend, backend.parse_options(options).__dict__


def is_cached(variant: KernelVariant) -> bool:
    """Whether Triton's on-disk cache already holds ``variant`` (a launch would load it, not compile it).
    Computes the cache key as ``triton.compile`` does."""
    import hashlib

    from triton.compiler.compiler import get_cache_invalidating_env_vars, get_cache_key
    from triton.runtime.cache import get_cache_manager

    source, _, backend, options = _source(variant)
    parsed = backend.parse_options(dict(options, **source.parse_options()))
    key = get_cache_key(source, backend, parsed, env_vars=get_cache_invalidating_env_vars())
    manager = get_cache_manager(hashlib.sha256(key.encode("utf-8")).hexdigest())
    name = f"{source.name[:150]}.json"
    return name in (manager.get_group(name) or {})


def compile_variant(variant: KernelVariant) -> float:
    """Compile ``variant`` into Triton's on-disk cache (a worker process runs this; no GPU is touched).
    Returns the seconds it took (near zero when the cache already had it)."""
    t0 = time.perf_counter()
    source, target, _, options = _source(variant)
    triton.compile(source, target=target, options=options)
    return time.perf_counter() - t0
