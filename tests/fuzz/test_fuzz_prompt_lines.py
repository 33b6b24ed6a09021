"""Fuzz: prompt lines. Every generated line is either served or rejected alone with a one-line reason;
no input raises, hangs, or loses or splits a result."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from support.fuzz_support import (
    assert_one_line,
    awkward_text,
    deeply_nested,
    examples,
    json_values,
    no_hang,
    numbers,
    raw_literals,
    to_json,
)

from graphtop.cli.headless import _result_line, _sampling, _serve
from graphtop.cli.prompts_file import SAMPLING_FIELDS, PromptLine, parse_line, read_prompts
from graphtop.engine.sampling_params import SamplingParams

FIELD_VALUES = st.one_of(
    numbers,
    awkward_text,
    raw_literals,
    st.booleans(),
    st.none(),
    st.lists(awkward_text, max_size=3),
    json_values,
    deeply_nested,
)
GOOD_VALUES = {
    "max_new_tokens": st.integers(1, 3),
    "temperature": st.sampled_from([0, 0.7, 1e-300, 2.5]),
    "top_k": st.integers(0, 5),
    "top_p": st.sampled_from([1.0, 0.5, 1e-9]),
    "seed": st.integers(0, 2**64 - 1),
    "stop": st.sampled_from([[], ["\n"], "x"]),
    "ignore_eos": st.booleans(),
    "min_tokens": st.integers(0, 3),
    "min_p": st.sampled_from([0.0, 0.2, 1.0]),
    "repetition_penalty": st.sampled_from([1.0, 0.5, 1.3]),
    "presence_penalty": st.sampled_from([0, -2.0, 1.5]),
    "frequency_penalty": st.sampled_from([0, 2, -0.5]),
    "logit_bias": st.sampled_from([{}, {"3": 5}, {"1": -100, "2": 100}, {"999999": 1}]),
    "stop_token_ids": st.sampled_from([[], [3], [1, 2]]),
    "include_stop_str_in_output": st.booleans(),
    "skip_special_tokens": st.booleans(),
}
objects = st.fixed_dictionaries(
    {"prompt": st.one_of(awkward_text, st.just("hello world"), FIELD_VALUES)},
    optional={
        **{k: st.one_of(GOOD_VALUES[k], FIELD_VALUES) for k in SAMPLING_FIELDS},
        "id": st.one_of(st.text(max_size=5), FIELD_VALUES),
        "extra": FIELD_VALUES,
    },
)
good_objects = st.fixed_dictionaries(
    {"prompt": st.one_of(st.just("hello world"), st.text(min_size=1, max_size=12))},
    optional={**GOOD_VALUES, "id": st.text(min_size=1, max_size=5)},
)
lines = st.one_of(
    objects.map(to_json),
    objects.map(lambda o: to_json(o, ensure_ascii=False)),  # raw U+2028, U+0085, ... inside JSON strings
    st.lists(st.one_of(awkward_text, st.text(max_size=10)), max_size=5).map("".join),
    json_values.map(to_json),
)


def check_line(pl: PromptLine, n: int) -> None:
    assert pl.line == n
    if pl.error is not None:
        assert pl.error.startswith(f"line {n}: ") and pl.prompt is None
        assert_one_line(pl.error)
    else:
        assert isinstance(pl.prompt, str)
        pl.prompt.encode("utf-8")
        params = SamplingParams(**pl.sampling)  # accepted here: cannot fail later, inside sampling
        assert params.max_new_tokens >= 1


@settings(max_examples=examples(500))
@given(line=lines)
def test_parse_line_accepts_or_rejects_alone(line):
    stripped = line.strip()
    if not stripped:
        return
    with no_hang():
        check_line(parse_line(3, stripped), 3)


@settings(max_examples=examples(150))
@given(batch=st.lists(lines, min_size=1, max_size=6))
def test_prompts_file_keeps_one_entry_per_line(tmp_path_factory, batch):
    path = tmp_path_factory.mktemp("fuzz") / "p.jsonl"
    path.write_text("\n".join(batch) + "\n", encoding="utf-8", errors="surrogatepass")
    wanted = [n for n, raw in enumerate(path.read_bytes().split(b"\n"), 1) if raw.strip()]
    with no_hang():
        try:
            got = read_prompts(str(path))
        except ValueError as e:  # the file as a whole: not UTF-8 (a lone surrogate written raw), or no prompts
            assert_one_line(str(e))
            return
    # a line is never split (U+2028, U+0085 are not line ends) nor dropped
    # (a BOM at the start of the file is an encoding mark, not text of line 1)
    lines = path.read_bytes().decode("utf-8-sig", errors="surrogatepass").split("\n")
    assert [pl.line for pl in got] == [n for n in wanted if lines[n - 1].strip()]
    for pl in got:
        check_line(pl, pl.line)


@pytest.fixture(scope="module")
def engine(tiny_ckpt):
    import torch

    from graphtop.engine.config import EngineConfig
    from graphtop.engine.engine import Engine
    from graphtop.engine.graphs.config import GraphConfig

    torch.set_num_threads(1)
    config = EngineConfig(
        device="cpu",
        max_total_tokens=1024,
        max_running_requests=4,
        chunked_prefill_size=32,
        max_context_len=48,
        graphs=GraphConfig(decode_backend="disabled", prefill_backend="disabled"),
    )
    return Engine.from_pretrained(tiny_ckpt("llama"), config=config)


@settings(max_examples=examples(60))
@given(batch=st.lists(st.one_of(good_objects, good_objects, objects).map(to_json), min_size=1, max_size=4))
def test_served_lines_each_get_one_result(tmp_path_factory, engine, batch):
    """Through the headless serving path: one output line per input line, errors only on rejected lines."""
    path = tmp_path_factory.mktemp("fuzz") / "p.jsonl"
    path.write_text("\n".join(batch) + "\n", encoding="utf-8")
    args = SimpleNamespace(max_new_tokens=2, temperature=0.0, top_p=1.0, top_k=0)
    with no_hang():
        parsed = read_prompts(str(path))
        for pl in parsed:  # the CLI's own cap keeps the fuzz fast: at most 2 new tokens a line
            if pl.error is None:
                pl.sampling["max_new_tokens"] = min(pl.sampling.get("max_new_tokens", 2), 2)
        served = _serve(engine, args, parsed, None)
    results = served.results
    assert served.failure is None and served.interrupted is None and len(results) == len(parsed)
    for pl, r in zip(parsed, results):
        line = json.loads(_result_line(r))
        assert line["id"] == pl.request_id
        if pl.error:
            assert line["error"] == pl.error and line["finish_reason"] == "rejected"
        else:
            assert _sampling(args, pl).max_new_tokens <= 2
            assert line["finish_reason"] in ("length", "eos", "stop", "rejected"), line
            event(f"served: {line['finish_reason']}")
            if line["finish_reason"] == "rejected":  # the engine's own admission (empty prompt, context)
                assert_one_line(line["error"])
