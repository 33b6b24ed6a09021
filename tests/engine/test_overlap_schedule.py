"""Overlap schedule on CPU (emulated graphs and eager): decode step N+1 is launched before N's tokens
are read back, and every output is token-for-token the plain loop's."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
from support.engine_prompts import PROMPTS, with_extra_eos

from graphtop.engine.request import FinishReason
from graphtop.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def llama(tiny_ckpt):
    return tiny_ckpt("llama")


def _run(engine, prompts, max_new):
    handles = [engine.submit(p, SamplingParams(max_new_tokens=m)) for p, m in zip(prompts, max_new)]
    engine.run_until_idle()
    assert engine.pool.used_pages == 0
    return [(h.token_ids, h.finish_reason) for h in handles]


@pytest.mark.parametrize("graphs", [None, False], ids=["emulated-graphs", "eager"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_overlap_matches_the_plain_loop_with_eos_and_length_finishes(llama, make_engine, tmp_path, graphs, page_size):
    max_new = [5, 17, 9, 30, 3, 12, 21, 8]
    free = (
        make_engine(llama, graphs=graphs, overlap_schedule=False)
        .generate([PROMPTS[1]], SamplingParams(max_new_tokens=30, ignore_eos=True))[0]
        .token_ids
    )
    eos_ckpt = with_extra_eos(llama, tmp_path / "eos", free[7])  # some requests now end by EOS mid-flight
    plain = make_engine(eos_ckpt, graphs=graphs, overlap_schedule=False, page_size=page_size)
    overlap = make_engine(eos_ckpt, graphs=graphs, page_size=page_size)
    want = _run(plain, PROMPTS, max_new)
    got = _run(overlap, PROMPTS, max_new)
    assert got == want
    assert plain.overlapped_steps == 0 and overlap.overlapped_steps > 10
    reasons = {r for _, r in want}
    assert FinishReason.EOS in reasons and FinishReason.LENGTH in reasons
    # the step stream counts the same forwards either way (extra EOS rows are not extra steps)
    assert overlap.loop.step_no <= plain.loop.step_no + 1


def test_cancel_while_a_step_is_in_flight_keeps_outputs_consistent(llama, make_engine):
    plain = make_engine(llama, overlap_schedule=False)
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    want = [h.token_ids for h in plain.generate(PROMPTS[:3], params)]
    engine = make_engine(llama)
    handles = [engine.submit(p, params) for p in PROMPTS[:3]]
    while engine.overlapped_steps < 3:
        assert engine.step()
    assert engine.loop.pending is not None  # a decode step is on the "device", not read back
    engine.cancel(handles[1].request_id)
    engine.run_until_idle()
    assert handles[1].finish_reason is FinishReason.CANCELLED
    got = handles[1].token_ids
    assert 0 < len(got) < 20 and got == want[1][: len(got)]  # a prefix: nothing lost, nothing invented
    assert [handles[0].token_ids, handles[2].token_ids] == [want[0], want[2]]
    assert engine.pool.used_pages == 0


def test_sampled_requests_and_a_queue_disable_overlap(llama, make_engine):
    engine = make_engine(llama)
    engine.generate(PROMPTS[:2], SamplingParams(max_new_tokens=8, temperature=0.8, seed=1))
    assert engine.overlapped_steps == 0  # tokens drawn on the host path: nothing to chain
    # more requests than may run at once: whenever one finishes, the queue admits a prefill
    engine = make_engine(llama, max_running_requests=2)
    out = engine.generate(PROMPTS[:4], SamplingParams(max_new_tokens=6, ignore_eos=True))
    assert [len(h.token_ids) for h in out] == [6] * 4
    assert engine.pool.used_pages == 0


def test_submit_while_a_step_is_in_flight_reads_it_back_first(llama, make_engine):
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    plain = make_engine(llama, overlap_schedule=False)
    want = [plain.generate([p], params)[0].token_ids for p in PROMPTS[:3]]  # one at a time
    engine = make_engine(llama)
    handles = [engine.submit(p, params) for p in PROMPTS[:2]]
    while engine.overlapped_steps < 2:
        assert engine.step()
    assert engine.loop.pending is not None
    done_before = [len(h.token_ids) for h in handles]
    handles.append(engine.submit(PROMPTS[2], params))
    engine.step()  # the queued submit makes this step read the launched one back before admitting
    assert [len(h.token_ids) for h in handles[:2]] == [n + 1 for n in done_before]
    engine.run_until_idle()
    assert [h.token_ids for h in handles] == want
    assert engine.pool.used_pages == 0


def test_decode_graphs_take_the_greedy_tokens_themselves(llama, make_engine, monkeypatch):
    """A decode replay returns each row's argmax (``StepOutput.tokens``, a view of the runner's static
    token buffer), and the overlap schedule reads those instead of launching its own argmax."""
    from graphtop.engine.step import overlap

    engine = make_engine(llama)
    runner = engine.model_runner.decode
    outs = []
    real = runner.run

    def spy(batch, decision):
        out = real(batch, decision)
        outs.append((out.logits.argmax(-1).tolist(), out.tokens.tolist(), out.tokens.data_ptr()))
        return out

    monkeypatch.setattr(runner, "run", spy)
    monkeypatch.setattr(overlap, "argmax_rows", lambda logits: pytest.fail("argmax launched after a graph"))
    handles = [engine.submit(p, SamplingParams(max_new_tokens=6, ignore_eos=True)) for p in PROMPTS[:3]]
    engine.run_until_idle()
    assert outs and engine.overlapped_steps > 0
    assert all(want == got for want, got, _ in outs)
    assert {ptr for *_, ptr in outs} == {runner.tokens_out.data_ptr()}
    assert all(len(h.token_ids) == 6 for h in handles)


def test_length_policy_has_one_home_for_finishing_and_chaining():
    """``Request.ends_by_length`` decides both when a request finishes by length and whether the overlap
    schedule may chain past the token in flight: max_new_tokens, the context limit and the KV pool's
    capacity, each at its exact boundary, and the token of context the chaining check keeps spare."""
    from graphtop.engine.request import Request

    req = Request("r", prompt_ids=[1] * 10, params=SamplingParams(max_new_tokens=5), handle=None)
    assert not req.ends_by_length(4, max_context_len=100, capacity_tokens=100)
    assert req.ends_by_length(5, max_context_len=100, capacity_tokens=100)  # max_new_tokens
    assert not req.ends_by_length(3, max_context_len=14, capacity_tokens=100)
    assert req.ends_by_length(4, max_context_len=14, capacity_tokens=100)  # prompt 10 + 4 = the context limit
    assert req.ends_by_length(4, max_context_len=100, capacity_tokens=14)  # ... or the whole pool
    assert not req.ends_by_length(2, max_context_len=14, capacity_tokens=100, spare=1)
    assert req.ends_by_length(3, max_context_len=14, capacity_tokens=100, spare=1)  # one token earlier


def test_switching_the_overlap_schedule_off_mid_chain_stops_chaining(llama, make_engine):
    """The setter says it may be switched between steps: a decode chain in flight used to go on
    overlapping regardless (``can_chain`` never looked at the switch)."""
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    want = make_engine(llama, overlap_schedule=False).generate([PROMPTS[0]], params)[0].token_ids
    engine = make_engine(llama, graphs=False)
    handle = engine.submit(PROMPTS[0], params)
    while engine.overlapped_steps < 3:
        assert engine.step()
    engine.overlap_schedule = False
    before = engine.overlapped_steps
    for _ in range(10):
        assert engine.step()
    assert engine.overlapped_steps == before and engine.loop.pending is None
    engine.overlap_schedule = True
    engine.run_until_idle()
    assert engine.overlapped_steps > before and handle.token_ids == want
