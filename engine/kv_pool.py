"""Paged KV pool: one allocation per K and V, carved into pages of ``page_size`` token slots.

Layout per layer is FlashInfer's NHD paged layout ``[num_pages, page_size, num_kv_heads, head_dim]``,
which viewed flat is ``[num_slots, num_kv_heads, head_dim]`` for the torch-native backend. Page 0 is
never handed out: it is the harmless target for padded graph rows, so padding can never overwrite a
real request's KV.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import MutableSequence, Sequence

import torch

DUMMY_PAGE = 0


class OutOfPages(RuntimeError):
    """The pool has fewer free pages than asked for (the scheduler queues or preempts)."""


@dataclass(frozen=True)
class KVLayout:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def bytes_per_token(self) -> int:
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * elem


class KVPool:
    def __init__(self, layout: KVLayout, num_pages: int, page_size: int, device: torch.device | str):
        if num_pages < 2:
            raise ValueError(f"KV pool needs at least 2 pages (one is the dummy page), got {num_pages}")
        if page_size < 1:
            raise ValueError(f"page size must be >= 1, got {page_size}")
        self.layout = layout
        self.num_pages = num_pages
        self.page_size = page_size
        self.device = torch.device(device)
        shape = (2, layout.num_layers, num_pages, page_size, layout.num_kv_heads, layout.head_dim)
        self._storage = torch.zeros(shape, dtype=layout.dtype, device=self.device)
        self.k_cache = [self._storage[0, i] for i in range(layout.num_layers)]
        self.v_cache = [self._storage[1, i] for i in range(layout.num_layers)]
        # Pop from the end: low page ids first, which keeps tests readable.
        self._free: list[int] = list(range(num_pages - 1, DUMMY_PAGE, -1))
        self._reserved = 0

    # --- capacity ------------------------------------------------------------------------------
    @property
    def capacity_pages(self) -> int:
        """Pages requests can hold: all but the dummy page and the reserved ones."""
        return self.num_pages - 1 - self._reserved

    @property
    def capacity_tokens(self) -> int:
        return self.capacity_pages * self.page_size

    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def used_pages(self) -> int:
        return self.capacity_pages - len(self._free)

    @property
    def nbytes(self) -> int:
        return self._storage.numel() * self._storage.element_size()

    def release(self) -> None:
        """Drop the storage (engine shutdown); the pool is unusable afterwards."""
        self._storage = torch.empty(0, dtype=self.layout.dtype, device=self.device)
        self.k_cache = []
        self.v_cache = []
        self._free = []

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    # --- allocation ----------------------------------------------------------------------------
    def alloc(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfPages(f"asked for {n} pages, {len(self._free)} free")
        out = self._free[-n:] if n else []
        del self._free[len(self._free) - n :]
        return out[::-1]

    def free(self, pages: list[int]) -> None:
        if DUMMY_PAGE in pages:
            raise ValueError("the dummy page is never owned by a request")
        self._free.extend(reversed(pages))

    def reserve(self, n: int) -> list[int]:
        """Take ``n`` free pages out of the requests' reach (the capacity shrinks by ``n``): scratch
        for work beside the requests, such as the eager re-run of a parity check."""
        pages = self.alloc(n)
        self._reserved += n
        return pages

    def unreserve(self, pages: list[int]) -> None:
        self._reserved -= len(pages)
        self.free(pages)

    def copy_pages(self, src: list[int], dst: list[int]) -> None:
        """Copy whole pages (every layer's K and V) from ``src`` to ``dst``, on the current stream."""
        if not src:
            return
        s = torch.tensor(src, dtype=torch.int64).to(self.device, non_blocking=True)
        d = torch.tensor(dst, dtype=torch.int64).to(self.device, non_blocking=True)
        self._storage.index_copy_(2, d, self._storage.index_select(2, s))

    def grow(self, pages: list[int], num_tokens: int) -> None:
        """Make ``pages`` cover ``num_tokens`` tokens, allocating what is missing (in place)."""
        need = self.pages_for(num_tokens) - len(pages)
        if need > 0:
            pages.extend(self.alloc(need))

    def grow_each(self, pages: Sequence[MutableSequence[int]], num_tokens: Sequence[int]) -> bool:
        """``grow`` for many requests at once (a decode step): one ``alloc`` for all of them, each list
        taking the next run of its pages, which is what ``grow`` called on them in order would give;
        or, when the free pages do not cover them all, no list touched and False."""
        pages_for = self.pages_for
        need = [pages_for(n) - len(p) for p, n in zip(pages, num_tokens)]
        total = sum(k for k in need if k > 0)
        if total > len(self._free):
            return False
        got, at = self.alloc(total), 0
        for p, k in zip(pages, need):
            if k == 1:
                p.append(got[at])
            elif k > 0:
                p.extend(got[at : at + k])
            at += max(k, 0)
        return True

    def slots(self, pages: list[int], start: int, end: int) -> list[int]:
        """Flat slot ids for token positions [start, end) of a request owning ``pages``."""
        ps = self.page_size
        return [pages[p // ps] * ps + p % ps for p in range(start, end)]
