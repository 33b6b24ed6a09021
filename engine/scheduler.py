"""Continuous batching with chunked prefill, admission by KV budget, and preempt-and-recompute.

Policy, every step:
1. Prefill and decode take turns while both have work: a step after a prefill step decodes every running
   request past its prefill, and a step after a decode step prefills. Neither waits for the other to run
   dry, so a long prompt's chunks never stall the requests already streaming, and a stream of arrivals
   never stalls them either. With only one kind of work, every step does it.
2. A prefill step continues chunked prefills and admits waiting requests while the token budget
   (``chunked_prefill_size``), ``max_running`` and free pages allow. The budget is shared
   (engine/prefill_share.py): the oldest request takes up to half, shorter ones than it come next,
   shortest first, so a short prompt behind a long one is prefilled in the next prefill step.
   Admission keeps one page of headroom per decoding request so a fresh admission cannot starve the
   next decode.
3. When the pool runs dry mid-decode, preempt the most recently admitted request: its pages are
   freed and it re-queues at the front; later its prompt and outputs are recomputed by prefill
   (greedy output is unchanged). The engine never crashes for lack of KV.

A model whose every layer attends within a sliding window (``SchedulerConfig.window``: Mistral with
``sliding_window``) reads no key older than the widest window again: before each step, a request's pages
that lie wholly before its next query's window go back to the pool, and their entries in its page list
read the dummy page (positions keep their place, and no layer's mask reaches them). The request gets a
new page array then, as when it frees all its pages, so whoever holds the old one (a tensor-parallel
rank's copy, a parity check's re-run) sees that it changed.
"""

from __future__ import annotations

import itertools
import time
from array import array
from collections import deque
from dataclasses import dataclass
from typing import Optional

from .batch import ForwardBatch, ForwardMode
from .kv_pool import DUMMY_PAGE, KVPool, OutOfPages
from .prefill_share import share_prefill_budget
from .request import Request, RequestStatus

MAX_SCORED_ROWS = 1024
"""Prompt positions one prefill step may score for prompt log-probabilities: each is a row of logits
(and of their float32 log-softmax), so a long prompt is scored a chunk of this size at a time instead of
asking for ``chunk x vocab`` logits at once (8k tokens of a 152k vocabulary: 5 GB in float32)."""


@dataclass(frozen=True)
class SchedulerConfig:
    chunked_prefill_size: int
    max_running: int
    #: keys every layer reads at most behind a query (``ModelSpec.kv_window``); None: some layer reads them all
    window: Optional[int] = None


class Scheduler:
    def __init__(self, pool: KVPool, config: SchedulerConfig):
        self.pool = pool
        self.config = config
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admitted: own pages; in prefill or decoding
        self.num_preemptions = 0
        self.decode_turn = False  # the last step prefilled: decoding goes first in the next one
        self.interleave = True
        """Prefill and decode take turns (policy 1). False: prefill first, until no prefill is left (a
        benchmark's fill, whose rows must all enter decode with one token: bench/harness.py)."""

    # --- queue management --------------------------------------------------------------------
    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, req: Request) -> None:
        """Release a request's pages (finished, cancelled or failed)."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self._release(req)
        req.status = RequestStatus.FINISHED

    def _release(self, req: Request) -> None:
        """Every page ``req`` still owns back to the pool, and a new (empty) page array for it."""
        if req.pages:
            self.pool.free(list(req.pages[req.dropped_pages :]))
            req.pages = array("i")
        req.dropped_pages = 0

    def _drop_out_of_window(self, req: Request, window: int) -> None:
        """Free ``req``'s pages wholly before the window of its next query (position ``num_computed``), which
        no layer reads again; their entries read the dummy page, in a new array (module docstring)."""
        keep_from = req.num_computed - window + 1  # the oldest key the next query attends to
        drop = min(keep_from // self.pool.page_size, len(req.pages)) if keep_from > 0 else 0
        if drop <= req.dropped_pages:
            return
        pages = req.pages
        self.pool.free(list(pages[req.dropped_pages : drop]))
        req.pages = array("i", [DUMMY_PAGE]) * drop + pages[drop:]
        req.dropped_pages = drop

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self._release(req)
        req.num_computed = 0
        req.status = RequestStatus.WAITING
        req.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    @property
    def used_tokens(self) -> int:
        return self.pool.used_pages * self.pool.page_size

    # --- scheduling ---------------------------------------------------------------------------
    def schedule(self) -> Optional[ForwardBatch]:
        while True:
            # one pass over the running requests (at a few hundred, per-request checks add up)
            prefilling: list[Request] = []
            ready: list[Request] = []
            window = self.config.window
            for r in self.running:
                if window is not None:
                    self._drop_out_of_window(r, window)
                (prefilling if r.in_prefill else ready).append(r)
            if self.decode_turn and self.interleave and ready:
                batch = self._schedule_decode(ready)
                if batch is None:  # every ready request was preempted: split again
                    continue
            else:
                batch = self._schedule_prefill(prefilling, len(ready)) or self._schedule_decode(ready)
            if batch is not None:
                self.decode_turn = batch.mode is ForwardMode.PREFILL
            if batch is not None or not self.running:
                return batch
            # Running requests exist but none can advance (partial prefills holding the pool).
            self._preempt(self.running[-1])

    def _schedule_prefill(self, prefilling: list[Request], decoding: int) -> Optional[ForwardBatch]:
        """``prefilling``: the running requests still in prefill; ``decoding``: how many others run.
        The budget is shared by ``share_prefill_budget`` among them and the waiting requests that could
        be admitted. Returning None, it has changed nothing (the decode step then sees the same split)."""
        budget = self.config.chunked_prefill_size
        slots = max(0, self.config.max_running - len(self.running))
        # every candidate takes at least a token, so more than ``budget`` of them never helps
        admissible = list(itertools.islice(self.waiting, min(slots, budget)))
        candidates = prefilling + admissible
        if not candidates:
            return None
        give = share_prefill_budget([_want(r) for r in candidates], budget)
        scored = [MAX_SCORED_ROWS]  # prompt-scoring rows left this step
        chosen: list[tuple[Request, int]] = []
        admitted: set[int] = set()  # ids of the waiting requests admitted this step
        for req, n in zip(prefilling, give):
            chunk = _scored(req, n, scored)
            if chunk == 0:
                continue
            try:
                self.pool.grow(req.pages, req.num_computed + chunk)
            except OutOfPages:
                break
            chosen.append((req, chunk))
        # admission in arrival order, stopping at the first that does not fit (as before the share)
        offset = len(prefilling)
        for i, req in enumerate(admissible):
            chunk = _scored(req, give[offset + i], scored)
            if chunk == 0:
                continue
            need = self.pool.pages_for(req.num_computed + chunk) - len(req.pages)
            if need > self.pool.free_pages - decoding:
                break
            self.pool.grow(req.pages, req.num_computed + chunk)
            req.status = RequestStatus.RUNNING
            if req.admitted is None:
                req.admitted = time.perf_counter()
            admitted.add(id(req))
            chosen.append((req, chunk))
        if admitted:
            self.waiting = deque(r for r in self.waiting if id(r) not in admitted)
            self.running.extend(r for r, _ in chosen if id(r) in admitted)
        if not chosen:
            return None
        return self._build(ForwardMode.PREFILL, chosen)

    def _schedule_decode(self, ready: list[Request]) -> Optional[ForwardBatch]:
        """``ready``: the running requests past their prefill, in queue order."""
        if not ready:
            return None
        if self.pool.grow_each([r.pages for r in ready], [r.num_computed + 1 for r in ready]):
            return self._build_decode(self._new_batch(ForwardMode.DECODE), ready)
        # short of pages: request by request, preempting from the back of the queue
        chosen: list[tuple[Request, int]] = []
        i = 0
        while i < len(ready):
            req = ready[i]
            try:
                self.pool.grow(req.pages, req.num_computed + 1)
            except OutOfPages:
                victim = self.running[-1]
                self._preempt(victim)
                if victim in ready:
                    idx = ready.index(victim)
                    ready.pop(idx)
                    if idx < i:
                        chosen = [(r, n) for r, n in chosen if r is not victim]
                        i -= 1
                continue
            chosen.append((req, 1))
            i += 1
        if not chosen:
            return None
        return self._build(ForwardMode.DECODE, chosen)

    def _new_batch(self, mode: ForwardMode) -> ForwardBatch:
        return ForwardBatch(
            mode=mode,
            requests=[],
            input_ids=[],
            positions=[],
            out_cache_loc=[],
            seq_lens=[],
            extend_lens=[],
            prefix_lens=[],
            req_pages=[],
            page_size=self.pool.page_size,
        )

    def _build(self, mode: ForwardMode, chosen: list[tuple[Request, int]]) -> ForwardBatch:
        batch = self._new_batch(mode)
        if mode is ForwardMode.DECODE:
            return self._build_decode(batch, [req for req, _ in chosen])
        for req, n in chosen:
            start = req.num_computed
            batch.requests.append(req)
            batch.input_ids.extend(_fill_slice(req, start, n))
            batch.positions.extend(range(start, start + n))
            batch.out_cache_loc.extend(self.pool.slots(req.pages, start, start + n))
            batch.seq_lens.append(start + n)
            batch.extend_lens.append(n)
            batch.prefix_lens.append(start)
            batch.req_pages.append(req.pages)
            req.num_computed = start + n
            if req.params.prompt_logprobs is not None:
                self._score_prompt(batch, req, start, n)
            # Sample when this step produces the request's next token: every decode step, and the
            # last prefill chunk of a request that has no output yet.
            if mode is ForwardMode.DECODE or (not req.output_ids and not req.in_prefill):
                batch.sample_rows.append(len(batch.input_ids) - 1)
                batch.sample_requests.append(req)
        return batch

    @staticmethod
    def _score_prompt(batch: ForwardBatch, req: Request, start: int, n: int) -> None:
        """Rows of this chunk (positions ``start``..``start + n - 1``, just added) whose logits score a
        prompt token not scored yet: position ``p`` scores token ``p + 1``. A recomputed prefill (after a
        preemption) scores nothing twice."""
        lo = max(start, req.prompt_logprobs_next - 1)
        hi = min(start + n, len(req.prompt_ids) - 1)
        if hi <= lo:
            return
        first = len(batch.input_ids) - n - start  # the row of position 0 in this batch
        batch.prompt_rows.extend(range(first + lo, first + hi))
        batch.prompt_targets.extend(req.prompt_ids[lo + 1 : hi + 1])
        batch.prompt_requests.append((req, hi - lo))
        req.prompt_logprobs_next = hi + 1

    def _build_decode(self, batch: ForwardBatch, reqs: list[Request]) -> ForwardBatch:
        """One token per request: the same fields as ``_build``, without its per-request slicing and
        list building (the scheduler's hot path at large batch)."""
        ps = self.pool.page_size
        ids, pos, loc, lens = batch.input_ids, batch.positions, batch.out_cache_loc, batch.seq_lens
        for req in reqs:
            start = req.num_computed
            lp = len(req.prompt_ids)
            ids.append(req.output_ids[start - lp] if start >= lp else req.prompt_ids[start])
            pos.append(start)
            pages = req.pages
            loc.append(pages[start // ps] * ps + start % ps)
            lens.append(start + 1)
            batch.req_pages.append(pages)
            req.num_computed = start + 1
        n = len(reqs)
        batch.requests = list(reqs)
        batch.extend_lens = [1] * n
        batch.prefix_lens = [length - 1 for length in lens]
        batch.sample_rows = list(range(n))
        batch.sample_requests = list(reqs)
        return batch


def _want(req: Request) -> int:
    """The prefill tokens ``req`` could take in one step: the rest of its prefill, no more prompt-scoring
    rows than a step has (``MAX_SCORED_ROWS``) while it scores its prompt."""
    want = req.prefill_target - req.num_computed
    if req.params.prompt_logprobs is not None and req.prompt_logprobs_next < len(req.prompt_ids):
        want = min(want, MAX_SCORED_ROWS)
    return want


def _scored(req: Request, chunk: int, left: list[int]) -> int:
    """``chunk``, cut to the prompt-scoring rows ``left`` this step (and taken from them) when ``req``
    still scores its prompt (``SamplingParams.prompt_logprobs``): each such row is a row of logits."""
    if req.params.prompt_logprobs is None or req.prompt_logprobs_next >= len(req.prompt_ids):
        return chunk
    chunk = min(chunk, left[0])
    left[0] -= chunk
    return chunk


def _fill_slice(req: Request, start: int, n: int) -> list[int]:
    """``req.fill_ids[start:start + n]`` without building prompt + output (O(context) per request per
    step: at batch 256 that list concatenation was most of the scheduler's time)."""
    prompt = req.prompt_ids
    lp = len(prompt)
    if start >= lp:
        return req.output_ids[start - lp : start - lp + n]
    if start + n <= lp:
        return prompt[start : start + n]
    return prompt[start:] + req.output_ids[: start + n - lp]
