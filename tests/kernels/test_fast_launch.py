"""``FastKernel`` launches a compiled kernel again with exactly what Triton's own launch path would pass.

Needs Triton, not a GPU (skipped without it): kernels compile for an sm_90 target against a stand-in driver
(tests/support/triton_host.py), and the launcher is replaced by a recorder of what it was handed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("triton")

from support.triton_host import (  # noqa: E402
    PagedAttention,
    compile_ahead,
    fused_kernels_on_cpu,
    fused_model,
    hopper_driver,
    stubbed_launches,
)
from triton._C.libtriton import native_specialize_impl  # noqa: E402
from triton.backends.nvidia.compiler import CUDABackend  # noqa: E402

from graphtop.models.kernels import fused, gemv, launch, precompile  # noqa: E402

INTS = [0, 1, 2, 15, 16, 17, 32, -1, -16, 2**31 - 1, 2**31, 2**32 + 16, 2**63, 2**64 - 16]


def triton_spec(value: Any) -> tuple:
    return tuple(native_specialize_impl(CUDABackend, value, False, True, True))


def test_the_specialization_key_separates_values_exactly_where_triton_does():
    base = torch.zeros(64, dtype=torch.bfloat16)
    values: list[Any] = [
        *INTS,
        True,
        False,
        0.5,
        1.0,
        None,
        base,
        base[1:],  # 2 bytes off: not 16-byte aligned
        base[8:],  # 16 bytes off: aligned
        torch.zeros(4, dtype=torch.float32),
        torch.zeros(4, dtype=torch.int64)[1:],
    ]
    for a in values:
        for b in values:
            same_for_triton = triton_spec(a) == triton_spec(b)
            same_for_us = launch.specialization_key((a,)) == launch.specialization_key((b,))
            assert same_for_us == same_for_triton, (a, b)


class Recorder:
    """Stands in for a compiled kernel's launcher: keeps what each launch handed it."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, *args: Any) -> None:
        self.calls.append(args)


@pytest.fixture
def recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from triton import knobs

    previous = knobs.cache.dir
    monkeypatch.delenv(precompile.CACHE_ENV, raising=False)
    precompile.point_triton_cache(tmp_path / "triton")
    recorder = Recorder()
    with hopper_driver(), stubbed_launches(recorder):
        yield recorder
    knobs.cache.dir = previous
    for kernel in launch._KERNELS.values():  # what compiled here stays here: later tests' dry runs record it
        kernel.plans.clear()
        kernel.fn.device_caches.clear()
        kernel.usable = True


def kernel_args(call: tuple) -> tuple:
    """The kernel's own arguments of a recorded launch (after grid, stream, function, metadata, hooks)."""
    return call[9:]


def same(a: tuple, b: tuple) -> bool:
    """Equal argument lists: tensors as the same memory, shape and strides; everything else equal and of one type."""

    def one(x: Any, y: Any) -> bool:
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            return all(isinstance(t, torch.Tensor) for t in (x, y)) and (
                (x.data_ptr(), x.shape, x.stride(), x.dtype) == (y.data_ptr(), y.shape, y.stride(), y.dtype)
            )
        return type(x) is type(y) and x == y

    return len(a) == len(b) and all(one(x, y) for x, y in zip(a, b))


def test_a_second_launch_passes_what_tritons_own_launch_passes(recorded: Recorder):
    x = torch.randn(64, 256, dtype=torch.bfloat16)
    w = torch.randn(96, 256, dtype=torch.bfloat16)
    nw = torch.ones(256, dtype=torch.bfloat16)
    kernel = launch.fast(gemv._gemv_kernel)
    before = kernel.fast_launches

    gemv.gemv(x[:1], w, norm_weight=nw, pdl=True)  # first launch: Triton's path (it compiles)
    assert kernel.fast_launches == before
    out = torch.empty(1, 96, dtype=torch.bfloat16)
    with launch.verifying():  # every fast launch is checked against Triton's own binding
        gemv.gemv(x[2:3], w, norm_weight=nw, pdl=True, out=out)
        assert kernel.fast_launches == before + 1
        fast_call = recorded.calls[-1]
        # the same launch through Triton's own path
        at = (1, 96, 256, 256, 1, False, False, True, False, gemv.pick_config(96, 256))
        grid, _, _, meta = gemv._SHAPES[at]
        gemv._gemv_kernel[grid](x[2:3], w, out, out, nw, w, out, out, 1, 96, 256, 256, 96, 0, 1e-6, **meta)
        triton_call = recorded.calls[-1]
    assert fast_call[:3] == triton_call[:3]  # the grid
    assert fast_call[4] is triton_call[4] or fast_call[4] == triton_call[4]  # the kernel's function handle
    assert same(kernel_args(fast_call), kernel_args(triton_call))


def test_a_misaligned_view_gets_its_own_compiled_kernel(recorded: Recorder):
    w = torch.randn(64, 128, dtype=torch.bfloat16)
    aligned = torch.randn(2, 128, dtype=torch.bfloat16)[:1]
    misaligned = torch.randn(2 * 128 + 1, dtype=torch.bfloat16)[1:].view(2, 128)[:1]  # 2 bytes off
    assert aligned.data_ptr() % 16 == 0 and misaligned.data_ptr() % 16 != 0
    kernel = launch.fast(gemv._gemv_kernel)
    compiled = kernel.fn.device_caches[0][0]
    known = len(compiled)
    gemv.gemv(aligned, w, pdl=False)
    gemv.gemv(misaligned, w, pdl=False)
    assert len(compiled) == known + 2  # Triton compiled one variant for each
    fast = kernel.fast_launches
    with launch.verifying():  # each launch is checked to pick the kernel Triton would
        gemv.gemv(misaligned, w, pdl=False)
        gemv.gemv(aligned, w, pdl=False)
    assert kernel.fast_launches == fast + 2 and len(compiled) == known + 2


def test_launch_hooks_take_tritons_own_path(recorded: Recorder):
    from triton import knobs

    x = torch.randn(4, 128, dtype=torch.bfloat16)
    w = torch.ones(128, dtype=torch.bfloat16)
    kernel = launch.fast(fused._rmsnorm_kernel)
    fused.rms_norm(x, w, 1e-6)
    fused.rms_norm(x, w, 1e-6)
    fast = kernel.fast_launches
    assert fast >= 1
    seen: list[Any] = []
    knobs.runtime.launch_enter_hook.add(seen.append)
    try:
        fused.rms_norm(x, w, 1e-6)
    finally:
        knobs.runtime.launch_enter_hook.remove(seen.append)
    assert kernel.fast_launches == fast  # a profiler's hook sees every launch: Triton's path ran it
    assert recorded.calls[-1][7] is knobs.runtime.launch_enter_hook


def test_a_decode_forward_launches_every_kernel_as_triton_would(recorded: Recorder):
    """The Qwen3-0.6B layer shape on the fused decode path (GEMVs with their prologues and epilogues, the MLP
    in one launch, the decode attention kernel, the lm_head GEMV) at 1 and 3 rows: after a first forward,
    every launch takes the fast path, each checked against Triton's own binding."""
    with fused_kernels_on_cpu(), torch.inference_mode():
        model = fused_model("qwen3-0.6b", fused_mlp=True, num_hidden_layers=2, vocab_size=2048)
        assert model.fused_mlp_layers() == 2
        steps = {r: (torch.arange(r), torch.arange(r) + 7, PagedAttention(model.spec, r)) for r in (1, 3)}

        def forward() -> None:
            for ids, pos, attn in steps.values():
                model.decode_logits(ids, pos, attn)

        missing, stats = compile_ahead(forward, workers=2)  # its last run: the first launches, Triton's path
        assert stats.failed == 0, stats.failures
        kernels = list({id(f): launch.fast(f) for f in _jit(missing)}.values())
        names = {k.fn.__name__ for k in kernels}
        assert names == {"_gemv_kernel", "_fused_mlp_kernel", "_decode_kernel"}, names
        before = {id(k): k.fast_launches for k in kernels}
        launches = len(recorded.calls)
        with launch.verifying():
            for ids, pos, attn in steps.values():
                model.decode_logits(ids, pos, attn)
    fast = sum(k.fast_launches - before[id(k)] for k in kernels)
    assert fast == len(recorded.calls) - launches > 0  # every launch of the second forward was a fast one
    assert all(k.fast_launches > before[id(k)] for k in kernels)


def test_a_skinny_decode_forward_launches_every_kernel_as_triton_would(recorded: Recorder):
    """The Qwen3-0.6B layer shape at 3 rows off the fused-GEMV layers: the skinny GEMM (the norms riding in
    the projections), the RMSNorm kernels and the decode attention, each fast launch checked."""
    with fused_kernels_on_cpu(), torch.inference_mode():
        model = fused_model("qwen3-0.6b", gemv_rows=1, num_hidden_layers=2, vocab_size=2048)
        ids, pos, attn = torch.arange(3), torch.arange(3) + 7, PagedAttention(model.spec, 3)
        missing, stats = compile_ahead(lambda: model.model.forward_pre_norm(ids, pos, attn), workers=2)
        assert stats.failed == 0, stats.failures
        kernels = list({id(f): launch.fast(f) for f in _jit(missing)}.values())
        assert {"_skinny_kernel", "_decode_kernel"} <= {k.fn.__name__ for k in kernels}
        before, launches = sum(k.fast_launches for k in kernels), len(recorded.calls)
        with launch.verifying():
            model.model.forward_pre_norm(ids, pos, attn)
    assert sum(k.fast_launches for k in kernels) - before == len(recorded.calls) - launches > 0


def _jit(variants: list) -> list:
    """The ``@triton.jit`` functions of recorded variants."""
    return [precompile._jit_function(v) for v in variants]


def test_a_gemv_config_changed_between_launches_takes_effect(recorded: Recorder, monkeypatch):
    """The launch-shape memo is keyed by the config in force: an A/B that replaces a tuned config between its
    engines (bench/ab_decode.py gemv=) launches the new one."""
    x = torch.randn(1, 256, dtype=torch.bfloat16)
    w = torch.randn(96, 256, dtype=torch.bfloat16)
    gemv.gemv(x, w, pdl=False)
    assert recorded.calls[-1][:2] == (12, 1)  # 8 rows a program: 12 programs
    monkeypatch.setitem(gemv.TUNED, (96, 256), (16, 256, 4, 2))
    gemv.gemv(x, w, pdl=False)
    assert recorded.calls[-1][:2] == (6, 1)


def test_an_argument_the_key_does_not_classify_keeps_tritons_path(recorded: Recorder):
    """Triton takes any object with ``data_ptr()`` and a dtype as a pointer and specializes it by its alignment;
    the key would only see its type, so a launch with one never gets a plan (it takes Triton's own path)."""

    class Pointer:
        def __init__(self, t: torch.Tensor) -> None:
            self.t, self.dtype = t, t.dtype

        def data_ptr(self) -> int:
            return self.t.data_ptr()

    x = torch.randn(4, 128, dtype=torch.bfloat16)
    w = torch.ones(128, dtype=torch.bfloat16)
    out = torch.empty_like(x)
    kernel = launch.fast(fused._rmsnorm_kernel)
    plans, fast = len(kernel.plans), kernel.fast_launches
    for _ in range(2):
        kernel[(4,)](Pointer(x), w, out, 128, 128, 1, 128, 128, 1e-6, BLOCK=128)
    assert len(kernel.plans) == plans and kernel.fast_launches == fast
    assert len(recorded.calls) == 2  # both launched, through Triton


def test_a_launcher_that_refuses_the_arguments_turns_the_fast_path_off(recorded: Recorder):
    """A Triton whose launcher parses other arguments than the ones this module passes raises TypeError
    before launching: that kernel goes back to Triton's own path for good, and the launch still happens."""
    x = torch.randn(4, 128, dtype=torch.bfloat16)
    w = torch.ones(128, dtype=torch.bfloat16)
    kernel = launch.fast(fused._rmsnorm_kernel)
    fused.rms_norm(x, w, 1e-6)  # compiles, plans
    calls = len(recorded.calls)

    def picky(*args: Any) -> None:
        if args[7] is None:  # this module passes no launch hooks
            raise TypeError("launch_enter_hook must be a HookChain")
        recorded(*args)

    from triton.compiler.compiler import CompiledKernel

    before = CompiledKernel.run
    CompiledKernel.run = property(lambda self: picky)
    try:
        fused.rms_norm(x, w, 1e-6)
        fused.rms_norm(x, w, 1e-6)
    finally:
        CompiledKernel.run = before
    assert not kernel.usable and len(recorded.calls) == calls + 2  # both launched, by Triton's path
