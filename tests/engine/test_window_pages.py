"""KV pages out of every layer's window go back to the pool: a model whose every layer is windowed
(Mistral with ``sliding_window``) holds about a window of pages per request however long it runs, and
serves the same tokens and logits to the bit as when it keeps them all; a model with a global layer
(Gemma, Qwen2's lower layers) frees nothing early. Emulated graphs, chunked prefill, preemption, and
(slow) two tensor-parallel ranks, whose page lists follow rank 0's."""

from __future__ import annotations

import os
from dataclasses import replace

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from support.tiny_models import shared_tokenizer

from graphtop.engine.kv_pool import DUMMY_PAGE, KVLayout, KVPool
from graphtop.engine.request import Request
from graphtop.engine.sampling_params import SamplingParams
from graphtop.engine.scheduler import Scheduler, SchedulerConfig
from graphtop.models import load_checkpoint

pytestmark = pytest.mark.usefixtures("torch_one_thread")

WINDOW, PAGE = 16, 4
PROMPTS = [
    "In a hole in the ground there lived a hobbit, not a nasty one, nor yet a dry bare sandy hole",
    "The quick brown fox jumps over the lazy dog, twice",
    "Once",
]


def run(engine, keep_all: bool, max_new: int = 60):
    """Greedy tokens and logits of ``PROMPTS``, and the most pages a request held while decoding; with
    ``keep_all`` the scheduler frees nothing before a request ends."""
    if keep_all:
        engine.scheduler.config = replace(engine.scheduler.config, window=None)
    held: list[int] = []
    schedule = engine.scheduler.schedule

    def watch():
        batch = schedule()
        if batch is not None and batch.mode.value == "decode":
            held.extend(len(r.pages) - r.dropped_pages for r in batch.requests)
            assert all(DUMMY_PAGE not in r.pages[r.dropped_pages :] for r in batch.requests)
        return batch

    engine.scheduler.schedule = watch
    params = SamplingParams(max_new_tokens=max_new, ignore_eos=True, logprobs=3)
    try:
        handles = engine.generate(PROMPTS, params)
        assert engine.pool.used_pages == 0  # every page back, none twice (the pool refuses the dummy page)
    finally:
        engine.close()
    return [h.token_ids for h in handles], [h.logprobs for h in handles], max(held)


@pytest.mark.parametrize("pool_tokens", [4096, 40])  # 40: keeping every page preempts
def test_pages_out_of_every_window_are_freed_and_change_nothing(tiny_ckpt, make_engine, pool_tokens):
    path = tiny_ckpt("mistral", sliding_window=WINDOW)
    config = dict(page_size=PAGE, chunked_prefill_size=8, max_total_tokens=pool_tokens)
    freed, kept = make_engine(path, **config), make_engine(path, **config)
    assert freed.scheduler.config.window == WINDOW
    schedulers = freed.scheduler, kept.scheduler
    tokens, logprobs, held = run(freed, keep_all=False)
    kept_tokens, kept_logprobs, kept_held = run(kept, keep_all=True)
    assert tokens == kept_tokens
    if pool_tokens == 4096:  # the same batches: the same logits to the bit
        assert logprobs == kept_logprobs
    else:  # requests recomputed after preemptions, in other batches: the same to rounding
        got = torch.tensor([t.logprob for row in logprobs for t in row])
        want = torch.tensor([t.logprob for row in kept_logprobs for t in row])
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    # a window's keys span at most WINDOW // PAGE + 1 pages, plus the page the next token goes to
    assert held <= WINDOW // PAGE + 2 < kept_held
    preemptions = [s.num_preemptions for s in schedulers]
    assert preemptions == [0, 0] if pool_tokens == 4096 else preemptions[0] < preemptions[1], preemptions


def test_a_preempted_or_finished_request_returns_only_the_pages_it_still_holds():
    """The dummy page in a page list's freed entries is never handed back; a recompute after preemption
    starts from a new, empty list and frees its pages again as it passes the window."""
    pool = KVPool(KVLayout(1, 1, 8, torch.float32), 64, PAGE, torch.device("cpu"))
    sched = Scheduler(pool, SchedulerConfig(8, 4, window=WINDOW))
    req = Request("r", list(range(30)), SamplingParams(max_new_tokens=100), None)
    sched.add(req)

    def advance(steps: int) -> None:
        for _ in range(steps):
            batch = sched.schedule()
            if batch.sample_requests:
                req.output_ids.append(7)

    advance(14)  # 4 prefill chunks (8, 8, 8, 6 tokens), then 10 decode steps
    assert req.num_computed == 40 and req.dropped_pages == (40 - WINDOW + 1) // PAGE == 6
    assert list(req.pages[:6]) == [DUMMY_PAGE] * 6 and DUMMY_PAGE not in req.pages[6:]
    assert pool.used_pages == len(req.pages) - 6
    before = req.pages
    advance(3)  # queries at 40, 41, 42: their windows start in page 6 (positions 25 to 27)
    assert req.pages is before and req.dropped_pages == 6
    advance(1)  # at 43 the window starts at 28, page 7: page 6 freed, and a new array says so
    assert req.pages is not before and req.dropped_pages == 7 and len(req.pages) - 7 <= WINDOW // PAGE + 2
    sched._preempt(req)
    assert pool.used_pages == 0 and len(req.pages) == 0 and req.dropped_pages == 0
    advance(14)
    assert req.dropped_pages > 0 and pool.used_pages == len(req.pages) - req.dropped_pages
    sched.finish(req)
    assert pool.used_pages == 0 and pool.free_pages == pool.capacity_pages


@pytest.mark.parametrize(
    "family, overrides, window",
    [
        ("mistral", {"sliding_window": WINDOW}, WINDOW),
        ("mixtral", {"sliding_window": WINDOW}, WINDOW),
        ("mistral", {}, None),  # no window
        ("gemma2", {}, None),  # a global layer beside the local one
        ("qwen2", {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1}, None),
    ],
)
def test_only_a_model_windowed_in_every_layer_frees_early(tiny_ckpt, family, overrides, window):
    assert load_checkpoint(tiny_ckpt(family, **overrides)).spec.kv_window == window


def test_the_widest_window_decides(tiny_ckpt):
    spec = load_checkpoint(tiny_ckpt("mistral", sliding_window=WINDOW)).spec
    assert replace(spec, sliding_window=8).kv_window == 8
    assert replace(spec, sliding_window=10**9).kv_window is None  # as long as the context: masks nothing


@pytest.mark.slow
def test_tensor_parallel_ranks_follow_the_freed_pages(tiny_ckpt, make_engine):
    """Rank 0 sends a request's whole new page list after it freed pages; the worker's tokens agree."""
    path = tiny_ckpt("mistral", sliding_window=WINDOW)
    config = dict(page_size=PAGE, chunked_prefill_size=16)
    tokens, _, held = run(make_engine(path, tp_size=2, **config), keep_all=False)
    want, _, _ = run(make_engine(path, **config), keep_all=True)
    assert tokens == want and held <= WINDOW // PAGE + 2


def test_the_prompts_outgrow_the_window():
    assert len(shared_tokenizer().encode(PROMPTS[0])) > 2 * WINDOW
