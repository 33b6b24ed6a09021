"""Engine core on CPU: KV accounting and preemption, sampling, stops, streaming, admission, cancel,
the background thread, and the event stream."""

from __future__ import annotations

import json
import os
import shutil
import threading

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from safetensors.torch import load_file, save_file
from support.engine_prompts import PROMPTS, with_extra_eos
from support.tiny_models import shared_tokenizer

from graphtop.engine.request import FinishReason
from graphtop.engine.sampling_params import SamplingParams
from graphtop.engine.telemetry import events as ev
from graphtop.engine.telemetry.bus import EventBus

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def llama(tiny_ckpt):
    return tiny_ckpt("llama")


@pytest.fixture(scope="module")
def ascii_ckpt(tiny_ckpt, tmp_path_factory):
    """A llama checkpoint whose lm_head rows are zero for every token that is not printable ASCII
    (special tokens included): greedy output is then plain ASCII text, so text comparisons are exact."""
    tok = shared_tokenizer()
    folder = tmp_path_factory.mktemp("ascii") / "llama-ascii"
    shutil.copytree(tiny_ckpt("llama", seed=3), folder)
    printable = torch.zeros(len(tok), dtype=torch.bool)
    for t in range(len(tok)):
        s = tok.decode([t])
        printable[t] = t not in tok.all_special_ids and bool(s) and all(32 <= ord(c) < 127 for c in s)
    weights = load_file(folder / "model.safetensors")
    head = weights["lm_head.weight"]
    head[~printable] = 0.0
    head[printable] *= 3.0  # clear maxima: the best printable logit is far above the zeros
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


# --- KV accounting ------------------------------------------------------------------------------


def test_pool_usage_returns_to_zero(llama, make_engine):
    bus = EventBus()
    kv = bus.subscribe("kv", types=["kv_pool"])
    engine = make_engine(llama, bus=bus, chunked_prefill_size=16)
    handles = [engine.submit(p, SamplingParams(max_new_tokens=12, ignore_eos=True)) for p in PROMPTS]
    peak = 0
    while engine.step():
        peak = max(peak, engine.pool.used_pages)
        assert engine.pool.used_pages <= engine.pool.capacity_pages
    assert all(h.finish_reason is FinishReason.LENGTH for h in handles)
    prompt_tokens = sum(len(h.prompt_ids) for h in handles)
    assert peak >= prompt_tokens  # everything was in the pool at once
    assert engine.pool.used_pages == 0 and engine.pool.free_pages == engine.pool.capacity_pages
    assert not engine.scheduler.running and not engine.scheduler.waiting
    states = kv.drain()  # rate-limited, but published whenever running/queued change
    assert all(0 <= s.used_tokens <= peak and s.capacity_tokens == engine.kv_capacity_tokens for s in states)
    assert any(s.used_tokens > 0 and s.running == len(PROMPTS) for s in states)
    assert states[-1].used_tokens == 0 and states[-1].running == 0 and states[-1].queued == 0


@pytest.mark.parametrize("graphs,page_size", [(False, 1), (True, 1), (True, 4)], ids=["eager", "graphs", "graphs-ps4"])
def test_workload_larger_than_pool_preempts_and_matches_one_at_a_time(llama, make_engine, graphs, page_size):
    engine = make_engine(
        llama, graphs=None if graphs else False, max_total_tokens=96, page_size=page_size, chunked_prefill_size=16
    )
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    alone = []
    for p in PROMPTS:
        alone.append(engine.generate([p], params)[0].token_ids)
        assert engine.pool.used_pages == 0
    assert engine.scheduler.num_preemptions == 0  # each request fits the pool by itself
    need = sum(len(shared_tokenizer().encode(p)) + params.max_new_tokens for p in PROMPTS)
    assert need > 3 * engine.pool.capacity_tokens  # ... but together they are far larger
    handles = engine.generate(PROMPTS, params)
    assert engine.scheduler.num_preemptions > 0
    assert [h.token_ids for h in handles] == alone
    assert all(h.finish_reason is FinishReason.LENGTH for h in handles)
    assert engine.pool.used_pages == 0


def test_single_request_longer_than_the_pool_stops_with_length(llama, make_engine):
    """A request that alone outgrows the pool cannot be saved by preemption: it must end, not spin."""
    engine = make_engine(llama, max_total_tokens=32)
    prompt = shared_tokenizer().encode(PROMPTS[1])
    assert 1 < len(prompt) < 32
    handle = engine.submit(prompt, SamplingParams(max_new_tokens=100, ignore_eos=True))
    engine.run_until_idle()
    assert handle.finished and handle.finish_reason is FinishReason.LENGTH
    assert len(prompt) + len(handle.token_ids) == engine.pool.capacity_tokens
    assert engine.pool.used_pages == 0


# --- sampling -----------------------------------------------------------------------------------


def test_seeded_sampling_reproducible_and_independent_of_neighbours(llama, make_engine):
    target = SamplingParams(max_new_tokens=24, temperature=0.9, top_k=50, top_p=0.95, seed=1234, ignore_eos=True)
    alone = make_engine(llama).generate([PROMPTS[1]], target)[0].token_ids
    again = make_engine(llama).generate([PROMPTS[1]], target)[0].token_ids
    assert alone == again

    engine = make_engine(llama, chunked_prefill_size=16)
    neighbours = [
        (PROMPTS[0], SamplingParams(max_new_tokens=30, temperature=1.0, seed=7, ignore_eos=True)),
        (PROMPTS[2], SamplingParams(max_new_tokens=10, ignore_eos=True)),
        (PROMPTS[3], SamplingParams(max_new_tokens=20, temperature=1.3, ignore_eos=True)),  # unseeded
    ]
    handles = [engine.submit(p, sp) for p, sp in neighbours[:2]]
    mine = engine.submit(PROMPTS[1], target)
    handles.append(engine.submit(*neighbours[2]))
    engine.run_until_idle()
    assert mine.token_ids == alone

    greedy = make_engine(llama).generate([PROMPTS[1]], SamplingParams(max_new_tokens=24, ignore_eos=True))[0]
    other_seed = make_engine(llama).generate([PROMPTS[1]], target.replace(seed=4321))[0]
    assert alone != greedy.token_ids  # it really sampled
    assert alone != other_seed.token_ids  # and the seed matters


def test_top_k_1_and_tiny_top_p_equal_greedy(llama, make_engine):
    engine = make_engine(llama, chunked_prefill_size=16)
    greedy = SamplingParams(max_new_tokens=20, ignore_eos=True)
    top_k1 = SamplingParams(max_new_tokens=20, temperature=1.5, top_k=1, ignore_eos=True)
    top_p0 = SamplingParams(max_new_tokens=20, temperature=1.0, top_p=1e-6, seed=3, ignore_eos=True)
    want = [h.token_ids for h in engine.generate(PROMPTS[:4], greedy)]
    assert [h.token_ids for h in engine.generate(PROMPTS[:4], top_k1)] == want
    assert [h.token_ids for h in engine.generate(PROMPTS[:4], top_p0)] == want


# --- stops --------------------------------------------------------------------------------------


def test_max_new_tokens_finishes_with_length(llama, make_engine):
    engine = make_engine(llama)
    handles = engine.generate(PROMPTS[:3], SamplingParams(max_new_tokens=7, ignore_eos=True))
    assert [len(h.token_ids) for h in handles] == [7, 7, 7]
    assert {h.finish_reason for h in handles} == {FinishReason.LENGTH}
    assert all(h.result()["finish_reason"] == "length" for h in handles)


def test_eos_finishes_with_eos_and_ignore_eos_overrides(llama, make_engine, tmp_path):
    free = make_engine(llama).generate([PROMPTS[2]], SamplingParams(max_new_tokens=24, ignore_eos=True))[0].token_ids
    stop_token = free[6]
    first = free.index(stop_token)
    engine = make_engine(with_extra_eos(llama, tmp_path / "eos", stop_token))
    handle = engine.generate([PROMPTS[2]], SamplingParams(max_new_tokens=24))[0]
    assert handle.finish_reason is FinishReason.EOS
    assert handle.token_ids == free[: first + 1]  # the EOS token itself is the last output
    ignoring = engine.generate([PROMPTS[2]], SamplingParams(max_new_tokens=24, ignore_eos=True))[0]
    assert ignoring.finish_reason is FinishReason.LENGTH and ignoring.token_ids == free


def test_stop_strings_cut_text_and_finish_with_stop(ascii_ckpt, make_engine):
    engine = make_engine(ascii_ckpt)
    base = engine.generate([PROMPTS[1]], SamplingParams(max_new_tokens=30))[0]
    text = base.text
    assert base.finish_reason is FinishReason.LENGTH and len(text) > 20 and text.isascii()
    tok = shared_tokenizer()
    for k in (2, 7, 13):
        stop = text[k : k + 2]
        cut = text[: text.find(stop)]
        h = engine.generate([PROMPTS[1]], SamplingParams(max_new_tokens=30, stop=("never-there", stop)))[0]
        assert h.finish_reason is FinishReason.STOP, stop
        assert h.text == cut and stop not in h.text
        assert h.token_ids == base.token_ids[: len(h.token_ids)]
        assert stop in tok.decode(h.token_ids)  # it stopped at the token that completed the stop string
        assert stop not in tok.decode(h.token_ids[:-1])
    never = engine.generate([PROMPTS[1]], SamplingParams(max_new_tokens=30, stop="\x00\x01"))[0]
    assert never.finish_reason is FinishReason.LENGTH and never.text == text


# --- streaming ----------------------------------------------------------------------------------


def test_new_text_deltas_concatenate_to_final_text(ascii_ckpt, make_engine):
    engine = make_engine(ascii_ckpt, chunked_prefill_size=16)
    handles = [engine.submit(p, SamplingParams(max_new_tokens=25)) for p in PROMPTS[:4]]
    deltas = {h.request_id: [] for h in handles}
    while engine.step():
        for h in handles:
            deltas[h.request_id].append(h.new_text())
    for h in handles:
        deltas[h.request_id].append(h.new_text())
        parts = [d for d in deltas[h.request_id] if d]
        assert h.text.isascii() and len(parts) > 5  # really incremental
        assert "".join(parts) == h.text
        assert h.text == shared_tokenizer().decode(h.token_ids, skip_special_tokens=True)


@pytest.mark.parametrize("stop_at", [None, 3, 8, 14])
def test_stream_concatenates_to_final_text(ascii_ckpt, make_engine, stop_at):
    """``stream()`` drives the engine itself; with stop strings the streamed text never shows a
    partial stop string that the final text then cuts off."""
    engine = make_engine(ascii_ckpt)
    base = engine.generate([PROMPTS[0]], SamplingParams(max_new_tokens=30))[0].text
    stop = () if stop_at is None else (base[stop_at : stop_at + 3],)
    others = [engine.submit(p, SamplingParams(max_new_tokens=12)) for p in PROMPTS[1:3]]
    handle = engine.submit(PROMPTS[0], SamplingParams(max_new_tokens=30, stop=stop))
    streamed = []
    for delta in handle.stream():
        assert handle.text.startswith("".join(streamed) + delta) or handle.finished
        streamed.append(delta)
    assert "".join(streamed) == handle.text
    assert handle.text == (base if stop_at is None else base[: base.find(stop[0])])
    engine.run_until_idle()
    assert all(o.finished for o in others)


def test_a_stream_left_early_cancels_its_request(ascii_ckpt, make_engine):
    """Nobody reads an abandoned stream's tokens: its request is cancelled and gives its pages back,
    instead of running to its length behind the caller's back."""
    engine = make_engine(ascii_ckpt)
    handle = engine.submit(PROMPTS[0], SamplingParams(max_new_tokens=200, ignore_eos=True))
    for i, _delta in enumerate(handle.stream()):
        if i == 2:
            break
    other = engine.generate([PROMPTS[1]], SamplingParams(max_new_tokens=2))[0]
    assert handle.finish_reason is FinishReason.CANCELLED and len(handle.token_ids) < 200
    assert other.finish_reason is FinishReason.LENGTH and engine.pool.used_pages == 0
    finished = engine.submit(PROMPTS[1], SamplingParams(max_new_tokens=3))
    assert "".join(finished.stream()) == finished.text and finished.finish_reason is FinishReason.LENGTH


# --- admission, cancel, background --------------------------------------------------------------


def test_bad_prompts_rejected_with_reason_while_others_complete(llama, make_engine):
    bus = EventBus()
    finished = bus.subscribe("fin", types=["request_finished"])
    engine = make_engine(llama, bus=bus, max_context_len=32, max_total_tokens=24)
    tok = shared_tokenizer()
    too_long = tok.encode("word " * 40)
    assert len(too_long) >= 32
    params = SamplingParams(max_new_tokens=5, ignore_eos=True)
    handles = engine.generate([PROMPTS[0], too_long, [], tok.encode("x " * 13), [len(tok) + 5], PROMPTS[3]], params)
    ok, long_, empty, over_pool, bad_id, ok2 = handles
    assert ok.finish_reason is FinishReason.LENGTH and len(ok.token_ids) == 5
    assert ok2.finish_reason is FinishReason.LENGTH and len(ok2.token_ids) == 5
    for h in (long_, empty, over_pool, bad_id):
        assert h.finish_reason is FinishReason.REJECTED and h.token_ids == [] and h.finished
    assert long_.error == f"prompt has {len(too_long)} tokens; the context limit is 32"
    assert empty.error == "empty prompt"
    assert "KV pool holds only 24" in over_pool.error
    assert "outside the vocabulary" in bad_id.error
    assert long_.result()["error"] == long_.error and long_.result()["finish_reason"] == "rejected"
    events = {e.request_id: e for e in finished.drain()}
    assert events[long_.request_id].finish_reason == "rejected" and events[long_.request_id].error == long_.error
    assert events[ok.request_id].finish_reason == "length" and events[ok.request_id].error is None


def test_a_cancel_on_an_otherwise_idle_engine_publishes_the_freed_pool(llama, make_engine):
    """The last kv_pool event must describe the pool as it is: a cancel with no step after it left the
    dashboard showing the cancelled request running and its pages used."""
    bus = EventBus()
    kv = bus.subscribe("kv", types=["kv_pool"])
    engine = make_engine(llama, bus=bus)
    handle = engine.submit(PROMPTS[0], SamplingParams(max_new_tokens=100, ignore_eos=True))
    for _ in range(5):
        engine.step()
    handle.cancel()
    engine.run_until_idle()
    last = kv.drain()[-1]
    assert handle.finish_reason is FinishReason.CANCELLED and engine.pool.used_pages == 0
    assert (last.running, last.queued, last.used_tokens) == (0, 0, 0)


def test_cancel_running_and_waiting_requests(llama, make_engine):
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    want = make_engine(llama).generate([PROMPTS[0]], params)[0].token_ids
    engine = make_engine(llama, max_running_requests=2)
    keep = engine.submit(PROMPTS[0], params)
    running = engine.submit(PROMPTS[1], params)
    waiting = engine.submit(PROMPTS[2], params)
    for _ in range(5):
        engine.step()
    assert len(engine.scheduler.running) == 2 and len(engine.scheduler.waiting) == 1
    running.cancel()
    engine.cancel(waiting.request_id)
    engine.cancel("no-such-request")  # ignored
    engine.run_until_idle()
    assert running.finish_reason is FinishReason.CANCELLED and 0 < len(running.token_ids) < 40
    assert waiting.finish_reason is FinishReason.CANCELLED and waiting.token_ids == []
    assert keep.finish_reason is FinishReason.LENGTH and keep.token_ids == want
    assert engine.pool.used_pages == 0


def test_background_thread_serves_other_threads_and_shutdown_joins(llama, make_engine):
    params = SamplingParams(max_new_tokens=16, ignore_eos=True)
    want = [h.token_ids for h in make_engine(llama).generate(PROMPTS[:4], params)]
    engine = make_engine(llama)
    engine.start_background()
    thread = engine.background._thread
    assert engine.background_running and thread is not None and thread.is_alive()
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def client(i: int) -> None:
        try:
            h = engine.submit(PROMPTS[i], params)
            assert h.wait(timeout=60)
            results[i] = h.token_ids
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    clients = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for c in clients:
        c.start()
    for c in clients:
        c.join(60)
    assert not errors and [results[i] for i in range(4)] == want
    again = engine.generate(PROMPTS[:2], params)  # generate() waits on the handles in this mode
    assert [h.token_ids for h in again] == want[:2]
    streamed = engine.submit(PROMPTS[2], params)
    assert "".join(streamed.stream()) == streamed.text and streamed.token_ids == want[2]
    engine.shutdown()
    assert not engine.background_running and not thread.is_alive() and engine.background._thread is None
    assert engine.last_error is None and engine.pool.used_pages == 0


# --- events -------------------------------------------------------------------------------------


def test_event_stream_of_a_run_is_complete_and_valid(llama, make_engine):
    bus = EventBus()
    sub = bus.subscribe("all")
    engine = make_engine(llama, bus=bus, chunked_prefill_size=16)
    handles = engine.generate(PROMPTS[:3], SamplingParams(max_new_tokens=10, ignore_eos=True))
    events = sub.drain()
    assert sub.dropped == 0

    for e in events:  # schema: every event survives JSON and validates, and reads back equal
        d = json.loads(json.dumps(e.to_dict()))
        assert ev.validate_event_dict(d) is type(e)
        assert ev.event_from_dict(d) == e

    kinds = [type(e) for e in events]
    assert kinds[0] is ev.EngineStarted
    started = events[0]
    assert started.device == "cpu" and started.emulated and started.architecture == "LlamaForCausalLM"
    for phase, buckets in (("decode", engine.decode_buckets), ("prefill", engine.prefill_buckets)):
        cap_start = [e for e in events if isinstance(e, ev.CaptureStarted) and e.phase == phase]
        progress = [e for e in events if isinstance(e, ev.CaptureProgress) and e.phase == phase]
        finish = [e for e in events if isinstance(e, ev.CaptureFinished) and e.phase == phase]
        assert len(cap_start) == 1 and cap_start[0].reason == "initial"
        # in the backend's order: emulated smallest first (no pool to share; CUDA is largest first)
        assert list(cap_start[0].buckets) == buckets
        assert [p.index for p in progress] == list(range(1, len(buckets) + 1))
        assert all(p.ok and p.total == len(buckets) for p in progress)
        assert len(finish) == 1 and finish[0].ok and list(finish[0].captured) == buckets
    assert any(isinstance(e, ev.MemoryLedger) and e.kv_pool == engine.pool.nbytes for e in events)

    steps = [e for e in events if isinstance(e, ev.StepEvent)]
    assert [s.step for s in steps] == list(range(1, len(steps) + 1))
    assert {s.phase for s in steps} == {"prefill", "decode"}
    first_step = kinds.index(ev.StepEvent)
    assert ev.MemoryLedger in kinds[:first_step] and ev.CaptureFinished in kinds[:first_step]
    kv = [e for e in events if isinstance(e, ev.KVPoolState)]
    assert kv and kv[0].used_tokens == 0 and kv[-1].used_tokens == 0 and kv[-1].running == 0
    assert any(k.running == 3 and k.used_tokens > 0 for k in kv)

    for h in handles:
        mine = [e for e in events if getattr(e, "request_id", None) == h.request_id]
        assert [type(e) for e in mine] == [ev.RequestQueued, ev.RequestFirstToken, ev.RequestFinished]
        queued, first, done = mine
        assert queued.prompt_tokens == len(h.prompt_ids) and queued.max_new_tokens == 10
        assert first.queue_ms is not None and 0.0 <= first.queue_ms <= first.ttft_ms  # the wait is part of TTFT
        assert done.output_tokens == 10 and done.finish_reason == "length" and done.latency_ms > 0
    ts = [e.ts for e in events]
    assert ts == sorted(ts)


def test_background_step_failure_fails_running_requests_and_keeps_serving(llama, make_engine):
    bus = EventBus()
    errors = bus.subscribe("errors", types=["error"])
    engine = make_engine(llama, bus=bus)
    real_forward = engine.model_runner.forward
    calls = {"n": 0}

    def forward_failing_once(batch):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("simulated kernel failure")
        return real_forward(batch)

    engine.model_runner.forward = forward_failing_once
    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    engine.start_background()
    try:
        victim = engine.submit(PROMPTS[0], params)
        assert victim.wait(30)
        later = engine.submit(PROMPTS[1], params)
        assert later.wait(30)
    finally:
        engine.shutdown()
    assert victim.finish_reason is FinishReason.CANCELLED
    assert victim.error == "RuntimeError: simulated kernel failure" == engine.last_error
    (error,) = errors.drain()
    assert error.message == victim.error and error.where == "step" and not error.fatal
    assert later.finish_reason is FinishReason.LENGTH and len(later.token_ids) == 8
    assert engine.pool.used_pages == 0


def test_chat_prompts_use_the_chat_template(llama, make_engine):
    engine = make_engine(llama)
    tok = shared_tokenizer()
    handle = engine.submit(
        "hi there", SamplingParams(max_new_tokens=3, ignore_eos=True), chat=True, request_id="chat-1"
    )
    want = tok.apply_chat_template(
        [{"role": "user", "content": "hi there"}], add_generation_prompt=True, tokenize=False
    )
    assert handle.request_id == "chat-1" and handle.prompt_ids == tok.encode(want)
    engine.run_until_idle()
    assert len(handle.token_ids) == 3
    ids = engine.submit(tok.encode("hi there"), SamplingParams(max_new_tokens=3, ignore_eos=True))
    assert ids.prompt == "hi there"  # token-id prompts are decoded for display


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(temperature=-0.5), "temperature"),
        (dict(top_k=-1), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(seed="7"), "seed"),
        (dict(stop=("",)), "stop"),
    ],
)
def test_invalid_sampling_params_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)
