"""Kernel variants found by a dry run compile in worker processes into the on-disk cache, and the launch
path then loads them instead of compiling.

Needs Triton (CUDA builds of torch ship it; these tests skip without it), not a GPU: Triton's launch path
runs up to its compile against a stand-in driver for an sm_90 target (tests/support/triton_host.py),
and the workers compile for that target.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from support.triton_host import hopper_driver  # noqa: E402

from graphtop.models.kernels import fused, gemv, precompile  # noqa: E402
from graphtop.models.kernels.compile_pool import KernelCompiler  # noqa: E402

if not precompile.supported():  # pragma: no cover - an old Triton
    pytest.skip("this Triton has no jit_cache_hook", allow_module_level=True)


@pytest.fixture
def triton_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from triton import knobs

    folder = tmp_path / "graphtop-cache" / "triton"
    monkeypatch.delenv(precompile.CACHE_ENV, raising=False)
    previous = knobs.cache.dir
    assert precompile.point_triton_cache(folder) == folder
    yield folder
    knobs.cache.dir = previous


def files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


def test_a_dry_run_records_variants_compiles_them_in_workers_and_the_launch_then_loads_them(triton_cache):
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    w = torch.ones(256, dtype=torch.bfloat16)
    with hopper_driver():
        with precompile.record_missing() as missing:
            fused.rms_norm(x, w, 1e-6)
            fused.rms_norm(x, w, 1e-6)  # the same variant again: recorded once
            fused.rms_norm(torch.randn(3, 512, dtype=torch.bfloat16), torch.ones(512, dtype=torch.bfloat16), 1e-6)
            # a decode projection: the fused GEMV with its RMSNorm prologue, launched with PDL on Hopper
            gemv.gemv(x[:1], torch.randn(384, 256, dtype=torch.bfloat16), norm_weight=w, pdl=True)
        labels = [v.label for v in missing]
        assert labels == ["fused._rmsnorm_kernel"] * 2 + ["gemv._gemv_kernel"]  # two block sizes: two variants
        assert files(triton_cache) == set()  # nothing compiled on this thread
        assert not any(precompile.is_cached(v) for v in missing)

        compiler = KernelCompiler(workers=2)
        try:
            keys = compiler.submit(missing)
            compiler.wait(keys)
            assert compiler.done(keys)
            assert compiler.stats.compiled == 3 and compiler.stats.failed == 0, compiler.stats.failures
        finally:
            compiler.close()
        assert all(precompile.is_cached(v) for v in missing)
        on_disk = files(triton_cache)
        assert any(name.endswith(".cubin") for name in on_disk)

        # the launch path (Triton's JITFunction, as a first launch would run it) finds them: no compile
        for variant in missing:
            kernel = precompile._jit_function(variant).preload(variant.specialization)
            assert kernel is not None and kernel.metadata.name == variant.name
        assert files(triton_cache) == on_disk

        # asked again (a recapture), the variants are found on disk and no worker starts
        again = KernelCompiler(workers=1)
        try:
            assert again.done(again.submit(missing)) and again.stats.on_disk == 3 and not again._procs
        finally:
            again.close()


def test_the_users_triton_cache_folder_wins_and_a_read_only_cache_is_left_alone(tmp_path, monkeypatch):
    from triton import knobs

    previous = knobs.cache.dir
    try:
        monkeypatch.setenv(precompile.CACHE_ENV, str(tmp_path / "mine"))
        assert precompile.point_triton_cache(tmp_path / "graphtop") == tmp_path / "mine"
        monkeypatch.delenv(precompile.CACHE_ENV)
        read_only = tmp_path / "ro"
        read_only.mkdir()
        read_only.chmod(0o500)
        if os.access(read_only, os.W_OK):  # root ignores the mode
            pytest.skip("this user can write a read-only folder")
        assert precompile.point_triton_cache(read_only / "triton") is None
        assert precompile.CACHE_ENV not in os.environ
    finally:
        knobs.cache.dir = previous


def test_a_launch_of_a_variant_a_worker_is_compiling_waits_for_that_worker():
    """The hook a compiler installs: a miss on another thread (an eager step) joins the worker's compile."""
    import threading
    from concurrent.futures import Future
    from types import SimpleNamespace

    from triton import knobs

    spec = '{"key": "k1", "signature": {}}'
    variant = precompile.KernelVariant("graphtop.models.kernels.fused", "_rmsnorm_kernel", spec)
    compiling: Future[float] = Future()
    previous = knobs.runtime.jit_cache_hook
    hook = precompile.join_in_flight(lambda key: compiling if key == variant.key else None)
    try:
        threading.Timer(0.05, compiling.set_result, (1.0,)).start()
        fn = SimpleNamespace(module=variant.module, name=variant.name)
        assert knobs.runtime.jit_cache_hook(fn=fn, compile={"specialization_data": spec}) is None  # then compile
        assert compiling.done()  # it returned only once the worker had finished
        other = SimpleNamespace(module=variant.module, name="_other")
        assert knobs.runtime.jit_cache_hook(fn=other, compile={"specialization_data": spec}) is None
    finally:
        precompile.leave(hook)
        knobs.runtime.jit_cache_hook = previous
    assert knobs.runtime.jit_cache_hook is previous


def test_a_specialization_without_its_target_gets_this_drivers():
    """Triton 3.6 leaves the target out of a variant's JSON (3.7+ writes it in): the recorder adds the
    device's, so a worker without a GPU knows what to compile for."""
    import json

    with hopper_driver():
        added = json.loads(precompile.with_target('{"key": "k", "name": "f"}'))
        assert added["target"] == {"backend": "cuda", "arch": 90, "warp_size": 32} and added["key"] == "k"
        written = '{"key": "k", "target": {"backend": "cuda", "arch": 100, "warp_size": 32}}'
        assert precompile.with_target(written) == written
