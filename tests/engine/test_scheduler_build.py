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
        r = Request(
            f"r{i}",
            [rng.randrange(1000) for _ in range(rng.randrange(1, 60))],
            SamplingParams(max_new_tokens=500),
            None,
        )
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


@pytest.mark.parametrize("page_size", [1, 4])
def test_growing_a_decode_step_at_once_gives_each_request_what_growing_one_by_one_would(page_size):
    """``KVPool.grow_each`` (the decode step's one cut of the free list) against ``grow`` in order:
    the same pages in every request's array and the same free list, for needs of none, one and many."""
    from array import array

    rng = random.Random(page_size)
    pools = [KVPool(KVLayout(1, 1, 8, torch.float32), 512, page_size, torch.device("cpu")) for _ in range(2)]
    for pool in pools:  # a used pool: pages handed out and returned in a scrambled order
        taken = [pool.alloc(rng.randrange(1, 5)) for _ in range(20)]
        rng.shuffle(taken)
        for t in taken[:12]:
            pool.free(t)
        rng.seed(page_size)
    owned = [[array("i", p) for p in ([], [3], [7, 9], [11])] for _ in range(2)]
    for step in range(30):
        counts = [rng.randrange(0, 3 * page_size) + step * 2 for _ in range(4)]
        ok = pools[0].grow_each(owned[0], counts)
        for p, n in zip(owned[1], counts):
            pools[1].grow(p, n)
        assert ok and owned[0] == owned[1] and pools[0]._free == pools[1]._free
        for p, n in zip(owned[0], counts):
            assert len(p) >= pools[0].pages_for(n)


def test_growing_at_once_touches_nothing_when_the_pages_do_not_suffice():
    from array import array

    pool = KVPool(KVLayout(1, 1, 8, torch.float32), 64, 1, torch.device("cpu"))
    free_before = list(pool._free)
    pages = [array("i"), array("i")]
    assert not pool.grow_each(pages, [40, len(free_before) - 39])
    assert pages == [array("i"), array("i")] and pool._free == free_before
    assert pool.grow_each(pages, [40, len(free_before) - 40]) and pool.free_pages == 0


def test_a_batch_reads_the_pages_of_its_longest_context_even_after_its_requests_grow():
    """``ForwardBatch.max_pages`` comes from the step's own context lengths: under the overlap schedule
    the requests' page arrays may already cover the next step when a runner reads it."""
    pool = KVPool(KVLayout(1, 1, 8, torch.float32), 4096, 1, torch.device("cpu"))
    sched = Scheduler(pool, SchedulerConfig(100_000, 8))
    reqs = [
        Request(f"r{i}", list(range(10, 10 + n)), SamplingParams(max_new_tokens=50), None)
        for i, n in enumerate([3, 8, 13])
    ]
    for r in reqs:
        sched.add(r)
    sched.schedule()  # prefill
    for r in reqs:
        r.output_ids.append(1)
    batch = sched.schedule()
    assert batch.mode is ForwardMode.DECODE and batch.max_pages == 14
    for r in reqs:
        r.output_ids.append(1)
    sched.schedule()  # the next step grows the same page arrays
    assert batch.max_pages == 14 and len(reqs[2].pages) == 15


def test_a_pushed_token_notifies_only_when_a_reader_waits(monkeypatch):
    """The step loop pushes every request's token every step; the handle's condition is notified only
    while a thread waits on it (``stream`` / ``wait``), and such a thread is woken by the push."""
    import threading
    import time

    from graphtop.engine.request import FinishReason, RequestHandle

    class Owner:
        background_running = True

        def refuse_inside_step(self, what: str) -> None:
            pass

    handle = RequestHandle("r", Owner(), "p", [1])
    notified = []
    real = handle._cond.notify_all
    monkeypatch.setattr(handle._cond, "notify_all", lambda: notified.append(1) or real())
    handle._push(5, "a")
    assert notified == [] and handle.token_ids == [5]
    chunks: list[str] = []
    reader = threading.Thread(target=lambda: chunks.extend(handle.stream()))
    reader.start()
    deadline = time.monotonic() + 5
    pushed = False
    while not pushed and time.monotonic() < deadline:
        with handle._lock:  # the reader cannot leave its wait while this thread holds the lock
            if handle._waiters == 1:
                handle._push(6, "b")  # the text the token adds
                pushed = True
        time.sleep(0.001)
    assert pushed and notified  # a waiting reader is woken by the push itself
    handle._finish(FinishReason.LENGTH)
    reader.join(timeout=5)
    assert not reader.is_alive() and "".join(chunks) == "ab" and handle._waiters == 0
