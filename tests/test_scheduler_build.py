"""The scheduler's decode fast path builds exactly what the general builder would."""

from __future__ import annotations

import random

import pytest
import torch

from graphtop.engine.batch import ForwardMode
from graphtop.engine.kv_pool import KVLayout, KVPool
from graphtop.engine.request import Request
from graphtop.engine.sampling_params import SamplingParams
from graphtop.engine.scheduler import Scheduler, SchedulerConfig, _fill_slice


@pytest.mark.parametrize("page_size", [1, 16])
def test_decode_batch_fields_match_the_request_state(page_size):
    rng = random.Random(page_size)
    pool = KVPool(KVLayout(1, 1, 8, torch.float32), 4096, page_size, torch.device("cpu"))
    sched = Scheduler(pool, SchedulerConfig(100_000, 64))
    reqs = []
    for i in range(20):
        r = Request(f"r{i}", [rng.randrange(1000) for _ in range(rng.randrange(1, 60))],
                    SamplingParams(max_new_tokens=500), None)
        sched.add(r)
        reqs.append(r)
    batch = sched.schedule()
    assert batch.mode is ForwardMode.PREFILL
    for step in range(rng.randrange(20, 40)):
        for r in batch.sample_requests:
            r.output_ids.append(rng.randrange(1000))
        before = {id(r): (r.num_computed, list(r.prompt_ids + r.output_ids)) for r in sched.running}
        batch = sched.schedule()
        assert batch.mode is ForwardMode.DECODE and batch.requests == reqs
        for i, r in enumerate(batch.requests):
            start, fill = before[id(r)]
            assert batch.input_ids[i] == fill[start]
            assert batch.positions[i] == start and batch.prefix_lens[i] == start
            assert batch.seq_lens[i] == start + 1 and batch.extend_lens[i] == 1
            assert batch.out_cache_loc[i] == pool.slots(r.pages, start, start + 1)[0]
            assert batch.req_pages[i] is r.pages and r.num_computed == start + 1
        assert batch.sample_rows == list(range(len(reqs))) and batch.sample_requests == reqs


def test_fill_slice_equals_slicing_prompt_plus_output():
    r = Request("r", list(range(100, 110)), SamplingParams(), None)
    r.output_ids = list(range(500, 505))
    full = r.fill_ids
    for start in range(len(full)):
        for n in range(0, len(full) - start + 1):
            assert _fill_slice(r, start, n) == full[start : start + n]


@pytest.mark.parametrize("page_size", [1, 16])
def test_flashinfer_page_lists_take_int32_arrays_and_lists_alike(page_size):
    """The FlashInfer backend's host-side page lists (pure Python, so checked here without a GPU):
    request page arrays (what the scheduler hands over) give exactly what plain lists give."""
    from array import array

    from graphtop.engine.attention.page_lists import page_lists

    rng = random.Random(page_size)
    lens = [1, page_size, page_size + 1, 37, 300]
    lists = [[rng.randrange(1, 10_000) for _ in range(-(-n // page_size) + 2)] for n in lens]  # + spare pages
    got = page_lists([array("i", p) for p in lists], lens, page_size)
    want = page_lists(lists, lens, page_size)
    assert got[0] == want[0] and list(got[1]) == list(want[1]) and got[2] == want[2]
    n_pages = [-(-n // page_size) for n in lens]
    assert got[0] == [sum(n_pages[:i]) for i in range(len(lens) + 1)]
    assert list(got[1]) == [pg for p, n in zip(lists, n_pages) for pg in p[:n]]
    assert got[2] == [n - (k - 1) * page_size for n, k in zip(lens, n_pages)]
