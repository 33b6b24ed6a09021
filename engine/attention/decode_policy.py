"""Which kernel decodes a batch under the FlashInfer backend: the Triton kernel or FlashInfer's own,
and on FlashInfer's, CUDA cores or tensor cores by GQA group. No torch, no kernels: the policy alone.
"""

from __future__ import annotations

#: GQA group sizes the CUDA-core decode kernel is instantiated for (DISPATCH_GQA_GROUP_SIZE, minus 16,
#: where tensor cores win); other groups decode on tensor cores (the prefill fa2 module).
CUDA_CORE_DECODE_GROUPS = (1, 2, 3, 4, 6, 8)
#: The decode kernel (``KernelConfig.decode_kernel``, engine/kernel_config.py): "auto" takes the Triton kernel
#: (models/kernels/decode_attention.py: q/k-norm, RoPE, K/V store, split-KV attention and merge in one
#: launch) up to TRITON_AUTO_MAX_ROWS rows and FlashInfer's above, or at every size from a GQA group
#: of TRITON_AUTO_GROUP (``triton_rows_for``); "triton" takes it at every size.
#: "auto" decodes batches of at most this many rows with the Triton kernel when the GQA group is
#: smaller than TRITON_AUTO_GROUP: in bench/decode_attn_bench.py it wins at bs 1-64 on both benchmark
#: shapes and loses at bs 256 on the Qwen3-0.6B shape (group 2; figures: docs/benchmarks.md).
TRITON_AUTO_MAX_ROWS = 64
#: from this GQA group on, "auto" takes the Triton kernel at every size: FlashInfer's CUDA-core decode
#: does a group's dot products one query head at a time, so its cost grows with the group, while the
#: Triton kernel runs a whole group (padded to 16 rows) as one tensor-core product. On the
#: Llama-3.1-8B shape (group 4) Triton won at 256 rows in the whole model (bench/ab_decode.py, group=N;
#: figures: docs/benchmarks.md).
TRITON_AUTO_GROUP = 4
EVERY_SIZE = 1 << 30  # triton_max_rows of "triton"


def triton_rows_for(kernel: str, group: int) -> int:
    """Decode batches of at most this many rows take the Triton kernel (0: never): the one home of
    the Triton-or-FlashInfer choice of ``KernelConfig.decode_kernel``."""
    if kernel == "triton" or (kernel == "auto" and group >= TRITON_AUTO_GROUP):
        return EVERY_SIZE
    return TRITON_AUTO_MAX_ROWS if kernel == "auto" else 0
