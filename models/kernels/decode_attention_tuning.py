"""Launch shapes of the paged decode attention kernel (``decode_attention.py``): ``DecodeTuning``, the
shipped tables per row count and GQA group, and how many programs share one context (``num_splits``).

Plain data and lookups, no Triton: ``PagedDecode`` reads the tables when it is built, so the sweeps
(bench/ab_decode.py) patch them here as module attributes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

MAX_SPLITS = 16


def num_splits(rows: int, kv_heads: int, sms: int, waves: int = 2) -> int:
    """Enough programs for ~``waves`` programs per SM, at most MAX_SPLITS, a power of two."""
    want = max(1, (waves * sms) // max(1, rows * kv_heads))
    return min(MAX_SPLITS, 1 << (want.bit_length() - 1))


@dataclass(frozen=True)
class DecodeTuning:
    """Launch shape: tokens per loop step, the smallest share of context worth a split of its own
    (shorter contexts stay in one program: no partials, no merge), warps, pipeline stages, what is
    requested before the PDL wait, and how many programs per SM the split count aims for.

    Defaults: the best mean of ``bench/decode_attn_bench.py --sweep`` over bs 1 and 8 at contexts 220
    and 1000, both benchmark shapes; in the whole model (``bench/ab_decode.py``) neither smaller nor
    larger split chunks did better (docs/benchmarks.md), except at 2-63 rows (DEFAULT_TUNING)."""

    block_t: int = 128
    min_chunk: int = 256
    num_warps: int = 4
    num_stages: int = 2
    # what a program requests before the PDL wait (fused path only): 0 nothing, 1 its first K/V tile,
    # 2 also the RoPE table row and the q/k-norm weights
    prefetch: int = 2
    waves: int = 2  # programs per SM the split count aims for (num_splits)
    # registers a thread may use (ptxas .maxnreg), 0 for the compiler's choice. The first K/V tile is
    # held in registers across the PDL wait, so a program's registers, not its shared memory, decide
    # how many fit an SM; a cap can buy more warps per scheduler, at the risk of spills. No shipped launch sets
    # one: in the model no capped launch beat them (bench/decode_attn_bench.py --sweep-regs)
    maxnreg: int = 0


#: what a PagedDecode built without ``tuning`` uses below LARGE_ROWS rows (head_dim <= 128; wider heads
#: halve block_t). 128-token splits since the splits' merge runs every query head at once: cheap enough
#: that a short context in two prefetched tiles beats one program loading its second tile after the PDL
#: wait (``bench/ab_decode.py``, the Llama-3.1-8B shape at 8-16 rows; docs/benchmarks.md)
DEFAULT_TUNING = DecodeTuning(min_chunk=128)
#: below LARGE_ROWS rows for GQA groups of at most SMALL_GROUP query heads a KV head: 64-token tiles
#: and splits, two warps. With so few query rows a program's work is short, and short contexts spread
#: over more, leaner programs (``bench/ab_decode.py``: Qwen3-0.6B, group 2, faster at 1 and 8 rows; the
#: group-4 Llama-3.1-8B shape was not, so it keeps the default)
SMALL_GROUP = 2
SMALL_GROUP_TUNING = DecodeTuning(block_t=64, min_chunk=64, num_warps=2)
#: one row, GQA groups above SMALL_GROUP: 256-token tiles, eight warps. A program's first tile is
#: requested before the PDL wait, so a context of up to 256 tokens (or a split of that many) is all in
#: flight while the q|k|v projection drains, and nothing is loaded after the wait but q|k|v itself.
#: At one row the grid (KV heads x splits) fits the SMs even at one program each (the tile's shared
#: memory allows no more); at 8 rows it does not, and the default's smaller tiles stay
#: (``bench/ab_decode.py``, Llama-3.1-8B at 1 and 8 rows; docs/benchmarks.md)
ONE_ROW_TUNING = DecodeTuning(block_t=256, num_warps=8)
#: from this many rows on: two warps a program, one more stage. Rows x KV heads fill the SMs (no context
#: splits), so more, leaner programs in flight beat wider ones (``bench/decode_attn_bench.py --sweep
#: --sweep-bs 64,128``: within 1 % of the best at 64 rows and 11 % at 128, contexts 220 and 1000, both
#: benchmark shapes)
LARGE_ROWS = 64
LARGE_TUNING = DecodeTuning(block_t=64, num_warps=2, num_stages=3)
#: from this many rows on, shorter tiles on a deeper pipeline. Each K/V load depends on a page-list
#: load, which costs the pipeliner stages: only from five stages on does it keep a second tile in flight
#: (``--sweep --sweep-deep --sweep-bs 256``: the best of the Llama-3.1-8B shape at contexts 220 and 1000;
#: the Qwen3-0.6B shape runs FlashInfer at this size)
HUGE_ROWS = 256
HUGE_TUNING = DecodeTuning(block_t=16, num_warps=2, num_stages=6)


def _for_head_dim(tuning: DecodeTuning, head_dim: int) -> DecodeTuning:
    """Heads wider than 128 halve the tile (registers), down to 16 tokens."""
    return tuning if head_dim <= 128 else replace(tuning, block_t=max(16, tuning.block_t // 2))


def shipped_tunings(group: int, head_dim: int) -> tuple[DecodeTuning, DecodeTuning, DecodeTuning, DecodeTuning]:
    """The launch shapes of a PagedDecode built without ``tuning``, for its GQA group and head_dim: below
    LARGE_ROWS rows, one row, from LARGE_ROWS rows and from HUGE_ROWS rows."""
    small, one_row = (
        (SMALL_GROUP_TUNING, SMALL_GROUP_TUNING) if group <= SMALL_GROUP else (DEFAULT_TUNING, ONE_ROW_TUNING)
    )
    return (
        _for_head_dim(small, head_dim),
        _for_head_dim(one_row, head_dim),
        _for_head_dim(LARGE_TUNING, head_dim),
        _for_head_dim(HUGE_TUNING, head_dim),
    )
