"""Kernel choices: one typed record inside ``EngineConfig``, resolved once, here.

The ``GRAPHTOP_*`` environment variables are kept for kernel experiments (docs/cli.md: tuning knobs): a
variable that is set overrides its field. This module is the only place that reads them; everything
downstream (the model's fused layers, the attention backend, the kernels' launch options) receives
the resolved values as arguments, so a benchmark switches kernels by passing a config, and a typo is
a one-line usage error before any model loads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from typing import Mapping

__all__ = ["CHOICES", "ENV", "KernelConfig", "resolve_kernel_config"]

#: field -> the values it takes
CHOICES: dict[str, tuple[str, ...]] = {
    # the fused-GEMV decoder layers for steps of <= EngineConfig.fused_gemv_max_rows tokens;
    # "auto" = on wherever the fused kernels run (CUDA bf16/fp16 with Triton), like "on"
    "fused_gemv": ("auto", "on", "off"),
    # "on": at the fused-GEMV layers' rows, a layer's MLP (RMSNorm, gate|up, SiLU·mul, down, residual add)
    # in one launch instead of two GEMVs (models/kernels/fused_mlp.py; bias-free MLPs not sharded by rows);
    # "auto": "on" for the MLP shapes where it measured faster (fused_mlp.MEASURED_WINS), "off" elsewhere
    "fused_mlp": ("auto", "off", "on"),
    # the skinny Triton GEMM for steps of 2-64 tokens, on the projections where it measured faster than
    # cuBLAS (models/kernels/skinny_tuning.py TUNED); "off" keeps cuBLAS for every projection; "packed" =
    # "auto", and where skinny_tuning.PACKED lists the shape's row class (the 8B at 17-64 tokens) the
    # projections read a copy of their weights in the kernel's tile order: faster there, for the layers'
    # projection bytes again in GPU memory (the KV pool is planned around the copy)
    "skinny_gemm": ("auto", "off", "packed"),
    # decode attention with the FlashInfer backend: "auto" = graphtop's one-launch Triton kernel up to
    # 64 rows and FlashInfer's own above, or Triton at every size for GQA groups >= 4
    # (attention/decode_policy.py triton_rows_for); "triton" = the Triton kernel at every size; "flashinfer" =
    # FlashInfer's own (CUDA or tensor cores by GQA group); the other three force one of FlashInfer's
    "decode_kernel": ("auto", "flashinfer", "cuda-core", "tensor-core", "tensor-core-nosplit", "triton"),
    # FlashInfer's prefill kernels: "fa2" is prebuilt; "fa3" and "auto" may compile on first use
    "prefill_backend": ("fa2", "fa3", "auto"),
    # programmatic dependent launch for the fused-GEMV and Triton decode kernels on Hopper+:
    # "auto" = kernels streaming <= 128 MiB of weights, "on" = all of them, "off" = none
    "pdl": ("auto", "on", "off"),
    # tensor-parallel all-reduce on CUDA: "auto" = torch's symmetric-memory one-shot kernel for small
    # messages (decode) when it passes its self-test, NCCL otherwise; "nccl" = NCCL for every size
    "all_reduce": ("auto", "nccl"),
    # "auto": on CUDA, each bucket's Triton kernels compile in worker processes before it is captured, and
    # steps run eagerly (kernels_compiling) meanwhile; "off": a capture compiles what it launches itself
    "precompile": ("auto", "off"),
}

#: field -> the environment variable that overrides it
ENV: dict[str, str] = {
    "fused_gemv": "GRAPHTOP_FUSED_GEMV",
    "fused_mlp": "GRAPHTOP_FUSED_MLP",
    "skinny_gemm": "GRAPHTOP_SKINNY_GEMM",
    "decode_kernel": "GRAPHTOP_FLASHINFER_DECODE",
    "prefill_backend": "GRAPHTOP_FLASHINFER_PREFILL_BACKEND",
    "pdl": "GRAPHTOP_PDL",
    "all_reduce": "GRAPHTOP_ALL_REDUCE",
    "precompile": "GRAPHTOP_PRECOMPILE",
}


@dataclass(frozen=True)
class KernelConfig:
    """Which kernels the engine uses where there is a choice (``CHOICES`` says what each value means)."""

    fused_gemv: str = "auto"
    decode_kernel: str = "auto"
    prefill_backend: str = "fa2"
    pdl: str = "auto"
    all_reduce: str = "auto"
    skinny_gemm: str = "auto"
    precompile: str = "auto"
    fused_mlp: str = "auto"

    @property
    def gemv_layers(self) -> bool:
        """Whether the fused-GEMV layers may be used (the device decides the rest)."""
        return self.fused_gemv != "off"

    @property
    def mlp_fused(self) -> bool:
        """Whether the one-launch MLP was asked for by name ("auto" lets the model's shape decide)."""
        return self.fused_mlp == "on"

    @property
    def skinny_layers(self) -> bool:
        """Whether steps of 2-64 tokens may run projections on the skinny GEMM (its table decides which)."""
        return self.skinny_gemm != "off"

    @property
    def skinny_packed(self) -> bool:
        """Whether the skinny projections read weight copies in tile order where that measured faster."""
        return self.skinny_gemm == "packed"


def resolve_kernel_config(config: KernelConfig, environ: Mapping[str, str] = os.environ) -> KernelConfig:
    """``config`` with each set ``GRAPHTOP_*`` variable in place of its field, every value checked.

    A value outside its choices raises ValueError with one line naming its source: the variable
    (``GRAPHTOP_PDL='yes': use one of auto, on, off``) or the field (``kernels.pdl=...``).
    """
    values: dict[str, str] = {}
    for f in fields(KernelConfig):
        env = ENV[f.name]
        value, source = (environ[env], env) if env in environ else (getattr(config, f.name), f"kernels.{f.name}")
        if value not in CHOICES[f.name]:
            raise ValueError(f"{source}={value!r}: use one of {', '.join(CHOICES[f.name])}")
        values[f.name] = value
    return replace(config, **values)
