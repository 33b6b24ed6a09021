"""Paged-KV metadata on the host, in the CSR form FlashInfer's wrappers and the Triton decode read.

``indptr`` holds cumulative page counts per request, ``indices`` the pages concatenated, and
``last_page_len`` the tokens in each request's last page. Built per step on the host, so it uses
``array`` and ``torch.frombuffer`` where a Python list per page would cost microseconds each.
"""

from __future__ import annotations

from array import array
from typing import Any, Sequence

import torch


def page_lists(
    req_pages: Sequence[Sequence[int]], seq_lens: list[int], page_size: int
) -> tuple[list[int], array, list[int]]:
    """indptr (cumulative page counts), indices (pages, concatenated), last_page_len, on the host."""
    ps = page_size
    indptr = [0]
    last: list[int] = []
    indices = array("i")
    total = 0
    for pages, s in zip(req_pages, seq_lens):
        n = (s + ps - 1) // ps
        indices.extend(pages if len(pages) == n else pages[:n])
        total += n
        indptr.append(total)
        last.append(s - (n - 1) * ps)
    return indptr, indices, last


def host_ints(values: Any, typecode: str, dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor from a list / array of ints; long lists go through ``array`` (much cheaper)."""
    if isinstance(values, array):
        return torch.frombuffer(values, dtype=dtype) if len(values) else torch.empty(0, dtype=dtype)
    if len(values) > 32:
        return torch.frombuffer(array(typecode, values), dtype=dtype)
    return torch.tensor(values, dtype=dtype)
