"""The scratch pages a parity check's eager re-run writes its K/V into (``checker.py``: why a check
cannot change what the requests get).

Each request's pages from its first new token on are swapped for scratch pages reserved from the pool,
and a first page that already holds earlier tokens is copied into its scratch page first.
"""

from __future__ import annotations

from array import array
from typing import Any, Optional

import torch

from ..batch import ForwardBatch
from ..kv_pool import KVPool


def scratch_pages(model_runner: Any, pool: KVPool, max_running: int) -> int:
    """KV pages the largest checkable step writes: a decode batch (a page per request) or a prefill
    step (its tokens' pages, plus a partly filled first page per request)."""
    decode = model_runner.decode.max_size if model_runner.decode else 0
    prefill = 0
    if model_runner.prefill:
        prefill = pool.pages_for(model_runner.prefill.max_size) + (max_running if pool.page_size > 1 else 0)
    return max(decode, prefill)


def pages_needed(batch: ForwardBatch) -> int:
    """Scratch pages the re-run of ``batch`` writes: each request's pages from its first new token."""
    ps = batch.page_size
    if ps == 1:
        return batch.num_tokens
    return sum((p + n - 1) // ps - p // ps + 1 for p, n in zip(batch.prefix_lens, batch.extend_lens))


def scratch_batch(
    batch: ForwardBatch, scratch: list[int], ps: int, ids: Optional[torch.Tensor]
) -> tuple[ForwardBatch, list[int], list[int]]:
    """``batch`` with every request's pages from its first new token swapped for scratch pages, and
    the pages to copy first (a first new page that already holds earlier tokens)."""
    req_pages: list[array] = []
    loc: list[int] = []
    src: list[int] = []
    dst: list[int] = []
    k = 0
    for pages, prefix, n in zip(batch.req_pages, batch.prefix_lens, batch.extend_lens):
        first, last = prefix // ps, (prefix + n - 1) // ps
        mine = scratch[k : k + last - first + 1]
        k += len(mine)
        if prefix % ps:
            src.append(pages[first])
            dst.append(mine[0])
        new = array("i", pages[:first])
        new.extend(mine)
        req_pages.append(new)
        loc.extend(new[p // ps] * ps + p % ps for p in range(prefix, prefix + n))
    check = ForwardBatch(
        mode=batch.mode,
        requests=batch.requests,
        input_ids=batch.input_ids,
        positions=batch.positions,
        out_cache_loc=loc,
        seq_lens=batch.seq_lens,
        extend_lens=batch.extend_lens,
        prefix_lens=batch.prefix_lens,
        req_pages=req_pages,
        page_size=ps,
        sample_rows=batch.sample_rows,
        input_ids_device=ids,
    )
    return check, src, dst
