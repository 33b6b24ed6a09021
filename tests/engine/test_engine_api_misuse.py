"""The Python API under misuse: wrong types are a TypeError with a one-line reason, prompts that cannot
be served come back rejected, ids stay unique among requests in flight, a closed engine takes nothing
new, and the background thread is the only one that steps while it runs. After each misuse the engine
still serves a good request with the tokens a clean run gives."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from graphtop.engine.config import EngineConfig
from graphtop.engine.engine import Engine
from graphtop.engine.errors import EngineError
from graphtop.engine.graphs.config import GraphConfig
from graphtop.engine.request import FinishReason
from graphtop.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.usefixtures("torch_one_thread")

GREEDY = SamplingParams(max_new_tokens=3)


@pytest.fixture(scope="module")
def llama(tiny_ckpt):
    return tiny_ckpt("llama")


@pytest.fixture
def engine(make_engine, llama):
    eng = make_engine(llama, graphs=False)
    yield eng
    eng.close()


def _one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert message and "\n" not in message
    return message


def _clean_tokens(engine: Engine) -> list[int]:
    return engine.generate([[5, 6, 7]], GREEDY)[0].token_ids


@pytest.mark.parametrize(
    "prompt, needle",
    [
        (b"abc", "got bytes"),
        ([1.5, 2.0], "token id #0 is 1.5 (float), not an integer"),
        (["1", "2"], "token id #0 is '1' (str)"),
        ([True, False], "token id #0 is a bool"),
        ({"a": 1}, "token id #0 is 'a' (str)"),
    ],
)
def test_token_ids_of_the_wrong_type_are_a_type_error(engine, prompt, needle):
    expected = _clean_tokens(engine)
    with pytest.raises(TypeError) as info:
        engine.submit(prompt, GREEDY)
    assert needle in _one_line(info)
    assert _clean_tokens(engine) == expected


@pytest.mark.parametrize("prompt", [[-1], [2**70], [10, 10**6]])
def test_token_ids_outside_the_vocabulary_are_rejected_not_raised(engine, prompt):
    handle = engine.submit(prompt, GREEDY)
    assert handle.finished and handle.finish_reason is FinishReason.REJECTED
    assert "outside the vocabulary" in handle.error


def test_numpy_integers_are_token_ids(engine):
    np = pytest.importorskip("numpy")
    expected = _clean_tokens(engine)
    assert engine.generate([np.array([5, 6, 7])], GREEDY)[0].token_ids == expected


def test_text_that_is_not_valid_unicode_is_a_value_error(engine):
    with pytest.raises(ValueError) as info:
        engine.submit("hi \ud800 there", GREEDY)
    assert "not valid Unicode" in _one_line(info)


def test_a_request_id_that_is_not_valid_unicode_is_a_value_error(engine, tmp_path):
    """It was served, and each of its events made a recorded trace unreadable as a whole."""
    from graphtop.engine.telemetry.recorder import TraceRecorder
    from graphtop.engine.trace_tools.trace import read_trace

    rec = TraceRecorder(tmp_path / "t.jsonl", engine.bus)
    with pytest.raises(ValueError) as info:
        engine.submit("hello", GREEDY, request_id="r\ud800")
    assert "request_id is not valid Unicode" in _one_line(info)
    engine.run_until_done([engine.submit("hello", GREEDY, request_id="r\u00e9")])
    rec.close()
    assert [e.request_id for e in read_trace(tmp_path / "t.jsonl").events if e.type == "request_finished"] == [
        "r\u00e9"
    ]


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(params="greedy"), "params must be a SamplingParams, got str"),
        (dict(params=SamplingParams), "params must be a SamplingParams, got type"),
        (dict(request_id=123), "request_id must be a str, got int"),
    ],
)
def test_wrong_argument_types_are_a_type_error(engine, kwargs, needle):
    with pytest.raises(TypeError) as info:
        engine.submit("hello", **kwargs)
    assert needle in _one_line(info)


def test_other_misuse_is_a_type_error(engine):
    with pytest.raises(TypeError, match="a list of prompts"):
        engine.generate("hi", GREEDY)
    with pytest.raises(TypeError, match="the handles submit returned"):
        engine.run_until_done([1])
    with pytest.raises(TypeError, match="parity every must be an int"):
        engine.set_parity_every(1.5)
    with pytest.raises(TypeError, match="overlap_schedule must be True or False"):
        engine.overlap_schedule = "no"
    assert engine.overlap_schedule is True


def test_a_request_id_in_flight_cannot_be_used_again(engine):
    sub = engine.bus.subscribe("test")
    first = engine.submit("hello", SamplingParams(max_new_tokens=20), request_id="D")
    second = engine.submit("world", SamplingParams(max_new_tokens=20), request_id="D")
    engine.step()
    assert second.finished and second.finish_reason is FinishReason.REJECTED and "already used" in second.error
    seen = sub.drain()
    assert not [e for e in seen if e.type == "request_finished" and e.request_id == "D"]  # the live one is not over
    assert any(e.type == "error" and "'D' is already used" in e.message for e in seen)
    engine.cancel("D")  # reaches the one request that holds the id
    engine.run_until_done([first])
    assert first.finish_reason is FinishReason.CANCELLED
    again = engine.submit("hello", GREEDY, request_id="D")  # free once it finished
    engine.run_until_done([again])
    assert again.finish_reason is FinishReason.LENGTH


def test_a_duplicate_id_is_refused_when_submit_returns(engine):
    first = engine.submit("hello", SamplingParams(max_new_tokens=5), request_id="E")
    second = engine.submit("world", SamplingParams(max_new_tokens=5), request_id="E")
    assert second.finished and second.finish_reason is FinishReason.REJECTED  # before any step ran
    engine.run_until_done([first])
    assert first.finish_reason is FinishReason.LENGTH and len(first.token_ids) == 5


def test_automatic_ids_skip_the_ids_callers_chose(engine):
    """A caller may name a request like an automatic id; the next automatic id skips it (it was taken
    even before the step loop saw that submit), so neither request is rejected."""
    chosen = [engine.submit("hello", GREEDY, request_id=f"req-{i}") for i in range(3)]
    auto = [engine.submit([5, 6, 7], GREEDY) for _ in range(3)]
    assert not {h.request_id for h in auto} & {h.request_id for h in chosen}
    assert len({h.request_id for h in auto}) == 3
    engine.run_until_done(chosen + auto)
    assert all(h.finish_reason is FinishReason.LENGTH for h in chosen + auto)
    assert all(h.token_ids == auto[0].token_ids for h in auto)
    reused = engine.submit([5, 6, 7], GREEDY, request_id=auto[0].request_id)  # free again once finished
    engine.run_until_done([reused])
    assert reused.finish_reason is FinishReason.LENGTH


def test_ids_of_requests_a_close_cancels_are_free(make_engine, llama):
    engine = make_engine(llama, graphs=False)
    handle = engine.submit("hello", GREEDY, request_id="F")
    engine.close()
    assert handle.finish_reason is FinishReason.CANCELLED
    assert "F" not in engine.in_flight.ids


def test_a_closed_engine_takes_nothing_new(make_engine, llama):
    engine = make_engine(llama, graphs=False)
    queued = engine.submit("hello", GREEDY)  # submitted, never stepped: closing finishes it
    engine.close()
    assert queued.finished and queued.finish_reason is FinishReason.CANCELLED
    assert list(queued.stream()) == []  # returns at once instead of waiting forever
    for call in (
        lambda: engine.submit("hello", GREEDY),
        engine.start_background,
        engine.serve_telemetry,
        lambda: engine.recapture(decode_bs=[1, 2]),
        lambda: engine.set_parity_every(4),
    ):
        with pytest.raises(EngineError, match="the engine is closed"):
            call()
    assert engine.step() is False
    engine.close()  # twice is fine


def test_step_is_refused_while_the_background_thread_serves(engine):
    expected = _clean_tokens(engine)
    engine.start_background()
    handles = [engine.submit("hello", SamplingParams(max_new_tokens=30)) for _ in range(3)]
    with pytest.raises(EngineError, match="background thread is serving"):
        engine.step()
    engine.run_until_done(handles)  # waits on the background thread instead of stepping
    for h in handles:
        assert h.finish_reason is FinishReason.LENGTH and h.error is None
    assert engine.generate([[5, 6, 7]], GREEDY)[0].token_ids == expected
    engine.shutdown()


@pytest.mark.parametrize(
    "overrides, error, needle",
    [
        (dict(max_total_tokens="2048"), TypeError, "max_total_tokens must be an int, got '2048' (str)"),
        (dict(page_size=1.0), TypeError, "page_size must be an int"),
        (dict(overlap_schedule="no"), TypeError, "overlap_schedule must be True or False"),
        (dict(max_context_len=1), ValueError, "max context len must be >= 2"),
        (dict(graphs={"decode": {"bs": [1]}}), TypeError, "graphs must be a GraphConfig, got dict"),
        (dict(graphs=GraphConfig(decode_bs=[1.5, 2])), ValueError, "decode.bs: '1.5' is not an integer"),
    ],
)
def test_engine_config_types_and_ranges(llama, overrides, error, needle):
    with pytest.raises(error) as info:
        Engine.from_pretrained(llama, device="cpu", **overrides)
    assert needle in _one_line(info)


def test_a_context_over_the_models_positions_is_refused(llama):
    """EngineConfig(max_context_len=...) above the model's max_position_embeddings (256) was lowered silently."""
    with pytest.raises(EngineError) as info:
        Engine.from_pretrained(llama, config=EngineConfig(device="cpu", max_total_tokens=512, max_context_len=257))
    assert _one_line(info) == (
        "max context len 257 is above the model's 256 positions (max_position_embeddings): "
        "use at most 256, or leave it unset"
    )


def test_overrides_leave_the_callers_config_as_it_was(llama):
    """from_pretrained's keyword overrides go to a copy: the caller's config is unchanged after a load
    and after a refused one, so it can be reused as given."""
    cfg = EngineConfig(device="cpu", dtype="float32", max_total_tokens=256)
    engine = Engine.from_pretrained(llama, config=cfg, page_size=4, max_running_requests=2)
    try:
        assert (engine.config.page_size, engine.config.max_running_requests) == (4, 2)
    finally:
        engine.close()
    assert (cfg.page_size, cfg.max_running_requests) == (1, None)
    with pytest.raises(ValueError, match="page size must be >= 1"):
        Engine.from_pretrained(llama, config=cfg, page_size=0)
    assert cfg.page_size == 1
    with pytest.raises(TypeError, match="unknown engine option 'validate'"):
        Engine.from_pretrained(llama, config=cfg, validate=None)
    cfg.validate()  # still a config that validates (a method was not replaced by an override)


def test_config_must_be_an_engine_config(llama):
    with pytest.raises(TypeError, match="config must be an EngineConfig, got str"):
        Engine.from_pretrained(llama, config="cfg")  # type: ignore[arg-type]
    EngineConfig().validate()  # the defaults pass


def test_one_bus_carries_one_open_engine(make_engine, llama):
    """Two engines on one bus both numbered requests req-0, …: one's finished req-0 removed the other's live
    one from every viewer. A second open engine is refused before anything is built; a closed or collected
    one hands the bus on."""
    import gc

    from graphtop.engine.telemetry.bus import BusInUse, EventBus

    bus = EventBus()
    first = make_engine(llama, bus=bus, graphs=False)
    sub = bus.subscribe("watch")
    with pytest.raises(BusInUse) as info:
        make_engine(llama, bus=bus, graphs=False)
    assert "already carries the events of another engine" in _one_line(info)
    assert not [e for e in sub.drain() if e.type == "engine_started"]  # the refused one published nothing
    first.close()
    second = make_engine(llama, bus=bus, graphs=False)  # the closed one hands the bus on
    assert second.generate(["hello"], GREEDY)[0].finish_reason
    del second
    gc.collect()
    make_engine(llama, bus=bus, graphs=False).close()  # so does one collected without close()
