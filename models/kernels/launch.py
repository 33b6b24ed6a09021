"""Launching a compiled Triton kernel again without Triton's per-call binding.

Why: ``kernel[grid](...)`` binds every argument, specializes each one in C++, hashes the specialization into
a cache key and walks Triton's launch options on every call: about 13 µs of host time a launch on the CPU
bench/eager_launch_bench.py's stub mode runs on, before the driver's own launch. A CUDA graph replays none
of that, but an eager decode step of a 28-layer model launches ~140 kernels, so it is host-bound by it
(the GPU work of the 0.6B's step is under a millisecond).

``FastKernel`` keeps, per specialization, the compiled kernel Triton returned for it and the argument
values Triton bound after the positional ones (constexprs, defaults), and launches it straight through
its launcher. The specialization key is computed here with the rules Triton applies (tensors: dtype and
16-byte alignment; ints: equal to 1, divisible by 16, 32-bit, 64-bit or unsigned; everything else: its
type), so two calls share a compiled kernel exactly when Triton would give them the same one.
``verifying()`` makes every launch also ask Triton's own binder and check that it would have picked the
same kernel with the same arguments (the tests run the decoder's kernels under it).

Whatever is not the plain case takes Triton's own path: a first launch of a specialization (it compiles,
or a dry run records it: models/kernels/precompile.py), launch hooks (profilers), pre-run hooks, callable
grids, a runtime argument passed by keyword, an argument the key cannot classify, Triton's interpreter,
and a Triton whose internals or launcher differ from what this module knows.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch
from triton import knobs
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction, compute_cache_key

__all__ = ["FastKernel", "fast", "specialization_key", "verifying"]

_I32_MIN, _I32_MAX, _U64_FROM = -(2**31), 2**31 - 1, 2**63
_PLANS_MAX = 4096
"""Specializations kept per kernel; past it a new one launches through Triton (no kernel has near this many)."""
_VERIFY = False
_RUN_KNOBS = ("instrumentation_mode", "fpsan_homomorphic_casts")
"""Compilation knobs ``JITFunction.run`` adds to a call's options before binding it (3.6: the first; 3.9: both)."""
ENABLED = True
"""Whether ``FastKernel`` launches bypass Triton's binding (bench/eager_launch_bench.py switches it off for the
other half of its A/B)."""
_Tensor = torch.Tensor
_data_ptr = torch.Tensor.data_ptr


def specialization_key(args: tuple) -> tuple:
    """What Triton's specialization of positional ``args`` depends on: a tensor's dtype and whether its
    address is 16-byte aligned; an int's being 1 (a constant then), divisible by 16, and 32-, 64-bit or unsigned;
    any other value's type (floats are fp32, bools u1, None a constant)."""
    return tuple(
        [
            (a.dtype, not _data_ptr(a) & 15)
            if isinstance(a, _Tensor)
            else (a == 1, not a & 15, _I32_MIN <= a <= _I32_MAX, a < _U64_FROM)
            if type(a) is int
            else type(a)
            for a in args
        ]
    )


@contextmanager
def verifying() -> Iterator[None]:
    """Check every ``FastKernel`` launch against Triton's own binding (tests)."""
    global _VERIFY
    before, _VERIFY = _VERIFY, True
    try:
        yield
    finally:
        _VERIFY = before


class _Plan:
    __slots__ = ("kernel", "tail")

    def __init__(self, kernel: Any, tail: tuple) -> None:
        self.kernel = kernel
        self.tail = tail


class FastKernel:
    """A ``@triton.jit`` function launched as ``FastKernel(fn)[grid](*runtime_args, **constexprs_and_options)``:
    runtime arguments positionally, constexprs and launch options (num_warps, launch_pdl, ...) by keyword."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.plans: dict[tuple, _Plan] = {}
        self.usable = isinstance(fn, JITFunction)  # not in Triton's interpreter (TRITON_INTERPRET=1)
        """False under the interpreter, or once this Triton's internals turned out different from what
        ``_bind`` expects."""
        self.fast_launches = 0

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def launch(self, grid: tuple[int, ...], args: tuple, kwargs: dict[str, Any]) -> Any:
        if (
            not (ENABLED and self.usable)
            or callable(grid)
            or self.fn.pre_run_hooks
            or _hooked(knobs.runtime.launch_enter_hook)
        ):
            return self.fn[grid](*args, **kwargs)
        active = driver.active
        device = active.get_current_device()
        key = (device, specialization_key(args), tuple(kwargs.items()))
        try:
            plan = self.plans.get(key)
        except TypeError:  # an unhashable keyword value
            return self.fn[grid](*args, **kwargs)
        if plan is None:
            kernel = self.fn[grid](*args, **kwargs)
            # None: a dry run recorded it uncompiled; an argument of a type the key does not classify as
            # Triton does (a numpy scalar, say) never gets a plan
            if kernel is not None and len(self.plans) < _PLANS_MAX and all(map(_plannable, args)):
                tail = self._tail(device, args, kwargs)
                if tail is not None:
                    self.plans[key] = _Plan(kernel, tail)
            return kernel
        kernel = plan.kernel
        if _VERIFY:
            self._verify(device, args, kwargs, plan)
        g1 = grid[1] if len(grid) > 1 else 1
        g2 = grid[2] if len(grid) > 2 else 1
        stream = active.get_current_stream(device)
        run, function, metadata = kernel.run, kernel.function, kernel.packed_metadata
        try:
            run(grid[0], g1, g2, stream, function, metadata, None, None, None, *args, *plan.tail)
        except TypeError:  # a launcher that parses other arguments (it raises before launching): Triton's path
            self.usable = False
            return self.fn[grid](*args, **kwargs)
        self.fast_launches += 1
        return kernel

    def _bind(self, device: int, args: tuple, kwargs: dict[str, Any]) -> Any:
        """Triton's own binding of a call: (bound arguments, specialization, options)."""
        binder = self.fn.device_caches[device][4]
        options = dict(kwargs, debug=kwargs.get("debug", self.fn.debug) or knobs.runtime.debug)
        for knob in _RUN_KNOBS:  # as JITFunction.run adds them (which ones depends on the Triton version)
            if hasattr(knobs.compilation, knob):
                options[knob] = getattr(knobs.compilation, knob)
        return binder(*args, **options)

    def _tail(self, device: int, args: tuple, kwargs: dict[str, Any]) -> tuple | None:
        """The bound values after the positional arguments (constexprs and defaults), which every launch of
        this specialization repeats; None where one of them is a runtime argument (it would vary)."""
        try:
            bound = list(self._bind(device, args, kwargs)[0].values())
        except Exception:  # a Triton whose internals differ: keep to its own path
            self.usable = False
            return None
        tail = bound[len(args) :]
        params = self.fn.params[len(args) :]
        if len(params) != len(tail) or any(not p.is_constexpr and p.name in kwargs for p in params):
            return None
        return tuple(tail)

    def _verify(self, device: int, args: tuple, kwargs: dict[str, Any], plan: _Plan) -> None:
        kernel_cache, key_cache = self.fn.device_caches[device][:2]
        bound, specialization, options = self._bind(device, args, kwargs)
        expected = kernel_cache.get(compute_cache_key(key_cache, specialization, options))
        name = getattr(self.fn, "__name__", "kernel")
        if expected is not plan.kernel:
            raise AssertionError(f"{name}: the specialization key picked another compiled kernel than Triton's")
        values, ours = list(bound.values()), [*args, *plan.tail]
        if len(values) != len(ours) or not all(_same(a, b) for a, b in zip(values, ours)):
            raise AssertionError(f"{name}: the launch's arguments differ from Triton's binding")


_KERNELS: dict[int, FastKernel] = {}


def fast(fn: Any) -> FastKernel:
    """The one ``FastKernel`` of a ``@triton.jit`` function: ``fast(kernel)[grid](...)`` for ``kernel[grid](...)``."""
    k = _KERNELS.get(id(fn))
    if k is None:
        k = _KERNELS[id(fn)] = FastKernel(fn)
    return k


def _plannable(arg: Any) -> bool:
    """An argument ``specialization_key`` classifies as Triton does: a tensor, or a plain int, float, bool or None."""
    return isinstance(arg, _Tensor) or type(arg) in (int, float, bool, type(None))


def _hooked(hook: Any) -> bool:
    """Whether a launch hook is set: a function, or a chain of them (Triton 3.9: an empty chain is always set)."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _same(a: Any, b: Any) -> bool:
    return a is b or (not isinstance(a, _Tensor) and not isinstance(b, _Tensor) and type(a) is type(b) and a == b)
