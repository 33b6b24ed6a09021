"""Where the skinny GEMM (``skinny.py``) runs and with which launch config: the row classes, the measured
configs of the benchmark shapes (``TUNED``), and the shapes whose layers keep their add+RMSNorms in the
projections or read packed weight copies.

Plain data and lookups, no Triton: the decoder's dispatch (models/layers/linear.py) and the sweeps
(bench/skinny_bench.py, bench/ab_decode.py) read and patch these tables as module attributes.
"""

from __future__ import annotations

MIN_M, MAX_M = 2, 256
PACKED: frozenset[tuple[int, int]] = frozenset({(4096, 64)})
"""(hidden size, row class) where the skinny projections read a copy of their weight in the launch's tile
order (``skinny.pack``) when the engine asks for it (``KernelConfig(skinny_gemm="packed")``: the copy costs the
projections' bytes again). Each tile is then one contiguous block instead of BLOCK_N runs of BLOCK_K
elements a row pitch apart. bench/ab_decode.py skinny=packed measured the Llama-3.1-8B's 64-row step
faster so; the Qwen3-0.6B's 64-row step and the 8B's 8-row chain (bench/packed_bench.py) did not move."""
ROW_CLASSES: tuple[int, ...] = (16, 64, 128, 256)
"""``TUNED``'s row classes: a batch of m rows takes the first class >= m, whose configs are measured at 8,
64, 128 or 256 rows. The activation tile is the MMA's N side, up to 256 wide."""
NORMS_IN_PROJECTIONS = True
"""Whether a decoder layer whose four projections take this kernel runs its add+RMSNorms inside them
(``skinny.skinny_add``, ``skinny.NormInput``); bench/ab_decode.py's norms=separate measures it off."""
NORMS_APART: frozenset[tuple[int, int]] = frozenset({(1024, 16)})
"""(hidden size, row class) where bench/ab_decode.py measured the separate add+RMSNorm kernels faster
than the norms in the projections: the Qwen3-0.6B at 2-16 rows (its o and down split K four ways)."""
POST_NORM_APART: frozenset[tuple[int, int]] = frozenset()
"""(hidden size, row class) of layers with the norms in the projections where the post-attention
add+RMSNorm would still run as its own kernel between the o and gate|up projections (o plain, gate|up on
the normalised rows); the down -> q|k|v norm stays in the projections. Empty: bench/ab_decode.py
post_norm=... measured the norm apart slower for the 8B at 2-16 rows and the 0.6B at 64 rows, and, since
the 8B's o at 17-64 rows splits K two ways (its epilogue, adding into the residual, run by half the
programs), for the 8B at 17-64 rows too."""


# (N, K, row class, silu) -> (BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages): the best of
# bench/skinny_bench.py --sweep on an H200 (row classes 16 and 64: measured at 8 and 64 rows), kept
# where it beat cuBLAS (plus the SiLU·mul kernel for gate|up) at the same rows, or where the whole sweep's
# table made the model's step faster in bench/ab_decode.py (the 8B's gate|up at 8 rows, qkv and o at 64:
# alone they lost, inside the layer's PDL chain they won). The 0.6B's o and down at 64 rows come from an
# in-model sweep (bench/ab_decode.py sk=...): 16 x 256 tiles split two ways, 128 programs; so do the 8B's
# gate|up and o at 64 rows (o split two ways: 128 programs, with the post-attention norm in the projections). A gate|up
# entry without SiLU (silu False) is for a row class where the fused epilogue lost: the plain GEMM here,
# the SiLU·mul kernel after it (the 0.6B at 64 rows: in-model against cuBLAS, not in isolation). Everything
# absent keeps cuBLAS: the Qwen3-0.6B and Llama-3.1-8B projections are what was measured.
TUNED: dict[tuple[int, int, int, bool], tuple[int, int, int, int, int]] = {
    # Qwen3-0.6B: qkv, o, gate|up, down
    (4096, 1024, 16, False): (64, 128, 1, 4, 6),
    (1024, 2048, 16, False): (32, 256, 4, 4, 6),
    (6144, 1024, 16, True): (32, 128, 1, 4, 4),
    (1024, 3072, 16, False): (64, 256, 4, 4, 3),
    (4096, 1024, 64, False): (64, 128, 1, 4, 4),
    (1024, 2048, 64, False): (16, 256, 2, 4, 4),
    (1024, 3072, 64, False): (16, 256, 2, 4, 4),
    (6144, 1024, 64, False): (64, 128, 1, 4, 4),  # gate|up, then the SiLU·mul kernel (no fused config)
    # Llama-3.1-8B
    (6144, 4096, 16, False): (64, 128, 1, 4, 4),
    (4096, 4096, 16, False): (32, 256, 1, 4, 6),
    (28672, 4096, 16, True): (64, 128, 1, 4, 4),
    (4096, 14336, 16, False): (32, 256, 1, 4, 6),
    (6144, 4096, 64, False): (64, 128, 1, 4, 4),
    (4096, 4096, 64, False): (64, 128, 2, 4, 4),
    (28672, 4096, 64, True): (64, 64, 1, 4, 3),
    (4096, 14336, 64, False): (64, 128, 2, 4, 4),
    # Llama-3.1-8B's lm_head (untied: the final norm folded in, DecoderForCausalLM.decode_logits)
    (128256, 4096, 16, False): (64, 128, 1, 4, 4),
    (128256, 4096, 64, False): (64, 64, 1, 4, 4),
}

Config = tuple[int, int, int, int, int]


def row_class(m: int) -> int | None:
    """The ``TUNED`` row class of an m-row batch, None outside the kernel's range."""
    if m < MIN_M or m > MAX_M:
        return None
    return next(c for c in ROW_CLASSES if m <= c)


def class_rows(row_class: int) -> tuple[int, int]:
    """The fewest and most rows of a batch that ``row_class`` serves (``row_class`` is its inverse)."""
    i = ROW_CLASSES.index(row_class)
    return (ROW_CLASSES[i - 1] + 1 if i else MIN_M), row_class


def configs_for(n: int, k: int, silu: bool = False) -> dict[int, Config]:
    """Row class -> launch config for an (N, K) weight, for the classes where the kernel won."""
    return {c: cfg for c in ROW_CLASSES if (cfg := TUNED.get((n, k, c, silu))) is not None}


def reads_packed(config: Config) -> bool:
    """Whether a launch of ``config`` can read a weight in ``skinny.pack``'s order: split-K launches (split >= 1);
    the stream-K kernel addresses row-major weights only."""
    return config[2] >= 1


def packs(hidden: int, row_class: int, config: Config) -> bool:
    """Whether a projection of a model of this hidden size, launched with ``config`` at ``row_class``,
    reads a packed copy of its weight when the engine asks for packed weights: the class is listed in
    ``PACKED`` and the launch can read one."""
    return (hidden, row_class) in PACKED and reads_packed(config)


def config_ok(n: int, k: int, cfg: Config, silu: bool = False) -> bool:
    """Whether a launch config tiles (N, K) exactly: whole column slabs, whole K tiles per split (a
    stream-K config, split <= 0, needs whole K tiles only)."""
    block_n, block_k, split, _, _ = cfg
    n_out = n // 2 if silu else n
    if split <= 0:
        return n_out % block_n == 0 and k % block_k == 0
    return n_out % block_n == 0 and k % (split * block_k) == 0 and k // split >= block_k
