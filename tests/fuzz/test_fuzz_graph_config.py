"""Fuzz: graph configs (the --cuda-graph-config JSON, the bucket-list flags, the resolution against a
pool). Every input resolves or is one GraphConfigError / BucketSpecError line, quickly; what resolves
never holds a bucket larger than the pool."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from support.fuzz_support import (
    assert_one_line,
    deeply_nested,
    examples,
    json_values,
    no_hang,
    numbers,
    raw_literals,
    to_json,
)

from graphtop.engine.graphs.bucket_list import BucketList, BucketSpecError
from graphtop.engine.graphs.config import KEYS, MAX_BUCKETS, GraphConfigError, build_graph_config, resolve_graph_config

sizes = st.one_of(st.integers(-3, 5000), st.sampled_from([10**9, 2**63, 10**30]))
size_lists = st.one_of(st.lists(sizes, max_size=8), st.integers(1, 20_000).map(lambda n: list(range(1, n + 1))))
field_values = st.one_of(
    sizes,
    size_lists,
    numbers,
    raw_literals,
    json_values,
    deeply_nested,
    st.sampled_from(["full", "breakable", "disabled", "piecewise", "1,2,4", ""]),
)
phase_bodies = st.dictionaries(
    st.sampled_from(["backend", "bs", "max_bs", "num_tokens", "max_num_tokens", "max_padding_waste", "colour"]),
    field_values,
    max_size=4,
)
configs = st.one_of(
    st.fixed_dictionaries({}, optional={"decode": phase_bodies, "prefill": phase_bodies}).map(to_json),
    json_values.map(to_json),
    st.text(max_size=30),
)
flags = st.fixed_dictionaries({}, optional={key: st.one_of(st.none(), field_values) for key in KEYS})
bucket_text = st.one_of(st.text(alphabet="0123456789-:, \t+x", max_size=24), st.text(max_size=12))


@settings(max_examples=examples(500))
@given(
    text=st.one_of(st.none(), configs),
    flag_values=flags,
    pool=st.integers(1, 2**24),
    running=st.integers(1, 4096),
    chunk=st.integers(1, 2**20),
    capturable=st.booleans(),
)
def test_graph_config_resolves_or_is_one_line(text, flag_values, pool, running, chunk, capturable):
    with no_hang(10):
        try:
            cfg = build_graph_config(text, flag_values)
            resolved = resolve_graph_config(
                cfg,
                max_running=min(running, pool),
                pool_tokens=pool,
                chunked_prefill_size=chunk,
                cuda_graphs_available=False,
                attention_supports_decode_graph=capturable,
            )
        except GraphConfigError as e:
            assert_one_line(str(e))
            return
    for key in ("decode.bs", "prefill.num_tokens"):
        if key in cfg.locked:
            assert len(cfg.get(key)) <= MAX_BUCKETS
    assert all(1 <= b <= pool for b in resolved.decode_bs + resolved.prefill_num_tokens)
    assert 0.0 <= resolved.prefill_max_padding_waste < float("inf")


@settings(max_examples=examples(500))
@given(text=bucket_text, maximum=st.one_of(st.none(), st.integers(1, 10**6)))
def test_bucket_text_parses_or_is_one_line(text, maximum):
    with no_hang(10):
        try:
            buckets = BucketList.parse(text, maximum=maximum).as_list()
        except BucketSpecError as e:
            assert_one_line(str(e))
            return
    assert buckets == sorted(set(buckets)) and 1 <= len(buckets) <= MAX_BUCKETS and buckets[0] >= 1
    assert maximum is None or buckets[-1] <= maximum
