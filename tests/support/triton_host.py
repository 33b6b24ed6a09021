"""Triton's host side without a GPU: a stand-in driver for an H100/H200 target (sm_90), so Triton's launch path
runs up to its compile (and compiles, for that target), and launchers that launch nothing, so the host side
of a launch runs whole. The tests and bench/eager_launch_bench.py's ``--device stub`` use them (the
benchmark puts tests/ on its path for it)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

import torch


class HopperDriver:
    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: Any = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)


@contextmanager
def hopper_driver() -> Iterator[None]:
    from triton.runtime.driver import driver

    previous = driver._active  # a machine without a GPU has no default driver to reset to
    driver.set_active(HopperDriver())
    try:
        yield
    finally:
        driver._active = previous


@contextmanager
def stubbed_launches(launcher: Callable[..., Any] = lambda *args: None) -> Iterator[None]:
    """Every compiled kernel's launcher replaced by ``launcher`` (given what a launch hands the driver's
    launcher: grid, stream, function, metadata, hooks, then the kernel's arguments), so the host side of a
    launch runs whole and nothing reaches a device."""
    from triton.compiler.compiler import CompiledKernel

    run, metadata = CompiledKernel.run, CompiledKernel.launch_metadata
    CompiledKernel.run = property(lambda self: launcher)
    CompiledKernel.launch_metadata = lambda self, grid, stream, *args: None
    try:
        yield
    finally:
        CompiledKernel.run, CompiledKernel.launch_metadata = run, metadata


class PagedAttention:
    """The decode attention the engine's Triton backend gives the model (``forward_qkv``: q/k-norm, RoPE, the
    K/V store and attention in one launch), over a small page table."""

    def __init__(self, spec: Any, rows: int) -> None:
        from graphtop.models.kernels.decode_attention import PagedDecode

        self.kernel = PagedDecode(
            spec.num_heads, spec.num_kv_heads, spec.head_dim, 16, spec.softmax_scale, rows, torch.device("cpu")
        )
        shape = (rows + 1, 16, spec.num_kv_heads, spec.head_dim)
        self.kv = torch.zeros(shape, dtype=torch.bfloat16), torch.zeros(shape, dtype=torch.bfloat16)
        self.indptr = torch.arange(rows + 1, dtype=torch.int32)
        self.indices = torch.arange(1, rows + 1, dtype=torch.int32)
        self.last = torch.full((rows,), 5, dtype=torch.int32)

    def forward_qkv(self, x, layer_id):
        k_cache, v_cache = self.kv
        return self.kernel.run_qkv(x, k_cache, v_cache, self.indptr, self.indices, self.last)

    def __call__(self, q, k, v, layer_id):  # pragma: no cover - the fused path always takes forward_qkv
        raise AssertionError("the fused decode path attends through forward_qkv")


@contextmanager
def fused_kernels_on_cpu() -> Iterator[None]:
    """The fused-kernel path taken for bf16/fp16 weights on the CPU (it is CUDA-only), and no graph capture
    running: with ``hopper_driver`` and ``stubbed_launches``, a CPU forward runs the host side of a CUDA one."""
    from graphtop.models.kernels import fused

    available, capturing = fused.available, torch.cuda.is_current_stream_capturing
    fused.available = lambda device, dtype: dtype in (torch.bfloat16, torch.float16)
    torch.cuda.is_current_stream_capturing = lambda: False
    try:
        yield
    finally:
        fused.available, torch.cuda.is_current_stream_capturing = available, capturing


def fused_model(shape: str, *, fused_mlp: bool = False, gemv_rows: int = 4, **overrides: Any) -> Any:
    """A bf16 model of a published shape on the CPU, on the fused-kernel path, the fused-GEMV layers for steps
    of up to ``gemv_rows`` rows (call it inside ``fused_kernels_on_cpu``); its weights are left uninitialised
    (launches that launch nothing read none), except the embeddings, the norms (ones) and RoPE's table."""
    from graphtop.models.decoder import DecoderForCausalLM
    from graphtop.models.registry import spec_from_hf_config
    from graphtop.models.synthetic.random_model import hf_config_for

    spec = spec_from_hf_config(hf_config_for(shape, **overrides), "<stub>")
    with torch.device("meta"):
        model = DecoderForCausalLM(spec)
    model.to_empty(device="cpu").to(torch.bfloat16)
    model.model.rotary_emb.to(torch.float32)
    torch.nn.init.normal_(model.model.embed_tokens.weight)
    for m in model.modules():
        if type(m).__name__ == "RMSNorm":
            m.weight.data.fill_(1.0)
    assert model.enable_fused_kernels(gemv_rows, pdl="on", fused_mlp=fused_mlp), "call inside fused_kernels_on_cpu()"
    return model


def compile_ahead(forward: Callable[[], Any], workers: Optional[int] = None) -> tuple[list, Any]:
    """Run ``forward`` dry, recording the kernel variants it would compile (models/kernels/precompile.py),
    compile them in worker processes for the driver's target, then run it once more: every variant's first
    launch (Triton's own path, which loads it) is behind the caller. Returns (the variants, the compiler's
    stats); a variant that failed to compile was compiled by that last run itself."""
    from graphtop.models.kernels import precompile
    from graphtop.models.kernels.compile_pool import KernelCompiler

    with precompile.record_missing() as missing:
        forward()
    compiler = KernelCompiler(workers)
    try:
        compiler.wait(compiler.submit(missing))
    finally:
        compiler.close()
    forward()
    return missing, compiler.stats
