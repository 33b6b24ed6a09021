"""Fair prefill: a long prompt's chunks take turns with other requests' prefill and decode, so a short
request behind it is not held hostage; prefill graphs still serve and greedy tokens are unchanged."""

from __future__ import annotations

import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from graphtop.engine.batch import ForwardMode
from graphtop.engine.kv_pool import KVLayout, KVPool
from graphtop.engine.prefill_share import share_prefill_budget
from graphtop.engine.request import FinishReason, Request
from graphtop.engine.sampling_params import SamplingParams
from graphtop.engine.scheduler import Scheduler, SchedulerConfig
from graphtop.engine.telemetry.bus import EventBus

LONG = 8000
CHUNK = 512


# --- the share ------------------------------------------------------------------------------------


def test_a_short_prompt_behind_a_long_one_gets_its_whole_prompt_and_the_step_stays_full():
    assert share_prefill_budget([8000, 5], 512) == [507, 5]
    assert share_prefill_budget([8000, 300, 5], 512) == [256, 251, 5]  # the oldest keeps half
    assert share_prefill_budget([100, 8000], 512) == [100, 412]
    assert share_prefill_budget([8000], 512) == [512]
    assert share_prefill_budget([], 512) == []


def test_prompts_of_one_length_go_first_come_first_served_not_all_at_once():
    assert share_prefill_budget([1000] * 6, 512) == [512, 0, 0, 0, 0, 0]
    assert share_prefill_budget([300] * 4, 512) == [300, 212, 0, 0]
    assert share_prefill_budget([300, 1000, 200], 512) == [300, 12, 200]  # only shorter ones pass the oldest


@pytest.mark.parametrize("seed", range(20))
def test_the_share_never_exceeds_a_want_or_the_budget_and_spends_all_it_can(seed):
    rng = random.Random(seed)
    wants = [rng.choice([0, 1, 3, rng.randrange(1, 9000)]) for _ in range(rng.randrange(1, 12))]
    budget = rng.randrange(1, 2049)
    give = share_prefill_budget(wants, budget)
    assert all(0 <= g <= w for g, w in zip(give, wants))
    assert sum(give) == min(budget, sum(wants))
    assert give[0] >= min(wants[0], -(-budget // 2))  # the oldest always advances


def test_a_negative_budget_or_want_is_refused():
    with pytest.raises(ValueError, match=">= 0"):
        share_prefill_budget([3, -1], 8)
    with pytest.raises(ValueError, match=">= 0"):
        share_prefill_budget([3], -8)


# --- the scheduler alone ----------------------------------------------------------------------------


def _run_batch(batch) -> None:
    """What the step loop does with a batch's samples: a token for each sampled request."""
    for r in batch.sample_requests:
        r.output_ids.append(7)


def test_scheduler_interleaves_a_short_request_with_a_long_prefill():
    pool = KVPool(KVLayout(1, 1, 8, torch.float32), LONG + 256, 16, torch.device("cpu"))
    sched = Scheduler(pool, SchedulerConfig(CHUNK, 8))
    long = Request("long", [5] * LONG, SamplingParams(max_new_tokens=4), None)
    sched.add(long)
    _run_batch(sched.schedule())  # the long prompt's first chunk
    short = Request("short", [6] * 20, SamplingParams(max_new_tokens=5), None)
    sched.add(short)
    modes = []
    while len(short.output_ids) < 5:
        batch = sched.schedule()
        modes.append(batch.mode)
        _run_batch(batch)
        if batch.mode is ForwardMode.PREFILL:
            assert batch.num_tokens == CHUNK  # every prefill step is as full as before
    # its prompt in the next step, whole; then decode and prefill alternate while both have work
    assert modes == [ForwardMode.PREFILL, ForwardMode.DECODE] * 4
    assert long.in_prefill and not long.output_ids  # done before the long prompt's prefill ends
    sched.finish(short)
    prefills = 0
    while long.in_prefill:
        batch = sched.schedule()
        assert batch.mode is ForwardMode.PREFILL  # alone with prefill work: every step prefills
        _run_batch(batch)
        prefills += 1
    assert long.output_ids and prefills == -(-(LONG - long.num_computed + prefills * CHUNK) // CHUNK)


# --- the engine on CPU ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def long_llama(tiny_ckpt):
    return tiny_ckpt("llama", max_position_embeddings=LONG + 512)


@pytest.mark.usefixtures("torch_one_thread")
def test_a_short_request_behind_an_8000_token_prompt_streams_before_that_prompt_is_prefilled(long_llama, make_engine):
    """On CPU an 8k-token prompt's chunk takes about a second here: the short request must not wait for
    all sixteen of them. Its greedy tokens equal its tokens alone."""
    bus = EventBus()
    steps = bus.subscribe("steps", types=["step"])
    engine = make_engine(long_llama, bus=bus, max_total_tokens=LONG + 512, chunked_prefill_size=CHUNK)
    rng = random.Random(0)
    long_prompt = [rng.randrange(10, 500) for _ in range(LONG)]
    short_prompt = [rng.randrange(10, 500) for _ in range(12)]
    params = SamplingParams(max_new_tokens=3, ignore_eos=True)
    short_alone = engine.generate([short_prompt], params)[0].token_ids
    steps.drain()

    long = engine.submit(long_prompt, params)
    engine.step()  # the long prompt's first chunk
    short = engine.submit(short_prompt, params)
    phases_at_first_token = None
    while not short.finished:
        engine.step()
        if phases_at_first_token is None and short.token_ids:
            phases_at_first_token = [s.phase for s in steps.drain()]
    # its whole prompt shares the next prefill step with the long prompt's second chunk ...
    assert phases_at_first_token == ["prefill", "prefill"]
    # ... then a decode step after each chunk (its last token may still be in flight one step more)
    rest = [s.phase for s in steps.drain()]
    assert rest[:3] == ["decode", "prefill", "decode"] and len(rest) <= 4
    (long_req,) = [r for r in engine.scheduler.running if r.request_id == long.request_id]
    assert long_req.num_computed <= 4 * CHUNK and not long.token_ids  # all while the long prompt prefills
    assert short.finish_reason is FinishReason.LENGTH and short.token_ids == short_alone
    engine.cancel(long.request_id)
    engine.run_until_idle()
    assert engine.pool.used_pages == 0


@pytest.mark.usefixtures("torch_one_thread")
@pytest.mark.parametrize("graphs", [False, None], ids=["eager", "graphs"])
def test_interleaved_prefill_keeps_every_greedy_token(tiny_ckpt, make_engine, graphs):
    """Requests that arrive while a long prompt prefills, each step's prefill shared between them and
    decode steps in between: every request's greedy tokens equal its tokens alone."""
    bus = EventBus()
    events = bus.subscribe("steps", types=["step"])
    engine = make_engine(tiny_ckpt("llama"), bus=bus, graphs=graphs, chunked_prefill_size=32)
    rng = random.Random(1)
    prompts = [[rng.randrange(10, 500) for _ in range(n)] for n in (200, 7, 40, 3, 90)]
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    alone = [engine.generate([p], params)[0].token_ids for p in prompts]
    events.drain()
    handles = []
    for p in prompts:  # one arrival per step
        handles.append(engine.submit(p, params))
        engine.step()
    engine.run_until_done(handles)
    assert [h.token_ids for h in handles] == alone
    steps = events.drain()
    # the 200-token prompt took 7 prefill steps; requests behind it decoded in between
    phases = "".join(s.phase[0] for s in steps)
    assert "dp" in phases[: phases.rindex("p")]
    if graphs is None:
        assert all(s.path == "graph" for s in steps)
