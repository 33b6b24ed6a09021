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
