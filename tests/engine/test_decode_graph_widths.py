"""Torch-native decode graphs are captured at several page-table widths, and a step replays the
narrowest that holds its longest row (one 4096-token table made every layer gather 4096
slots a row, slower than the eager step from batch 64 on). Kernels that walk each row's own pages keep
one graph per bucket."""

from __future__ import annotations

import pytest

from graphtop.engine.attention.torch_native import GRAPH_MAX_CONTEXT, GRAPH_MIN_CONTEXT
from graphtop.engine.graphs.backend import ShapeKey
from graphtop.engine.graphs.bucket_policy import pick_graph_width
from graphtop.engine.sampling_params import SamplingParams


@pytest.mark.parametrize(
    "widths,pages,expected",
    [
        ([0], 1, 0),
        ([0], 10_000, 0),
        ([1088, 1024, 512, 256], 1, 256),
        ([1088, 1024, 512, 256], 256, 256),
        ([1088, 1024, 512, 256], 257, 512),
        ([1088, 1024, 512, 256], 1025, 1088),
        ([1088, 1024, 512, 256], 1088, 1088),
    ],
)
def test_pick_graph_width_is_the_narrowest_that_holds_the_longest_row(widths, pages, expected):
    assert pick_graph_width(widths, pages) == expected


def test_one_graph_a_bucket_is_the_contracts_default():
    """FlashInfer and the Triton kernel walk only each row's own pages: no widths to choose from."""
    from graphtop.engine.attention.base import AttentionBackend

    assert AttentionBackend.graph_widths(object()) == [0]


@pytest.mark.parametrize(
    "page_size,max_context,expected",
    [
        (1, 1088, [1088, 1024, 512, 256]),  # tokens
        (1, 8192, [4096, 2048, 1024, 512, 256]),  # the graph covers GRAPH_MAX_CONTEXT; longer rows run eagerly
        (16, 8192, [256, 128, 64, 32, 16]),  # pages of 16 tokens
        (1, 200, [200]),  # one width where the whole context is under the narrowest table
    ],
)
def test_torch_native_widths_double_from_the_narrowest_table(tiny_ckpt, make_engine, page_size, max_context, expected):
    assert GRAPH_MIN_CONTEXT == 256 and GRAPH_MAX_CONTEXT == 4096
    eng = make_engine(
        tiny_ckpt("qwen3", max_position_embeddings=8192),
        attention_backend="torch",
        page_size=page_size,
        max_context_len=max_context,
        max_total_tokens=max_context + 64,
    )
    try:
        assert eng.model_runner.decode.widths == expected
        backend = eng.model_runner.decode.backend
        captured = {(k.size, k.width) for k in backend.keys() if k.phase == "decode"}
        assert captured == {(b, w) for b in eng.decode_buckets for w in expected}  # every bucket at every width
        assert set(eng.model_runner.decode.ledger) == set(eng.decode_buckets)  # one ledger entry a bucket
    finally:
        eng.close()


def test_steps_replay_the_narrowest_width_as_contexts_grow(tiny_ckpt, make_engine, monkeypatch):
    """A request crossing 256 tokens of context moves from the 256-wide graph to the 512-wide one, and
    the tokens equal the eager engine's."""
    path = tiny_ckpt("qwen3", max_position_embeddings=8192)
    params = SamplingParams(max_new_tokens=24, ignore_eos=True, detokenize=False)
    prompt = [(7 * i) % 200 + 10 for i in range(244)]
    eager = make_engine(path, attention_backend="torch", max_context_len=1088, max_total_tokens=1200, graphs=False)
    try:
        want = eager.generate([prompt], params)[0].token_ids
    finally:
        eager.close()
    eng = make_engine(path, attention_backend="torch", max_context_len=1088, max_total_tokens=1200)
    try:
        runner = eng.model_runner.decode
        replayed: list[ShapeKey] = []
        real = runner.backend.replay
        monkeypatch.setattr(runner.backend, "replay", lambda key: (replayed.append(key), real(key))[1])
        got = eng.generate([prompt], params)[0].token_ids
    finally:
        eng.close()
    assert got == want
    widths = [k.width for k in replayed]
    assert widths and widths == sorted(widths)  # the context only grows
    assert set(widths) == {256, 512}  # 244 + 24 tokens cross 256 once
