"""bench/decode_attn_bench.py's slot layouts: every layout hands out each cache slot once (slot 0
never), and "engine" is what a fresh pool gives with page size 1: prompts consecutive, then one slot a
row per decode step."""

from __future__ import annotations

import decode_attn_bench as dab
import pytest


@pytest.mark.parametrize("layout", dab.LAYOUTS)
@pytest.mark.parametrize("bs,ctx", [(1, 5), (3, 130), (4, 128), (2, 300)])
def test_every_layout_uses_each_slot_once(layout, bs, ctx):
    order = dab.slot_order(layout, bs, ctx)
    assert tuple(order.shape) == (bs, ctx)
    assert sorted(order.reshape(-1).tolist()) == list(range(1, bs * ctx + 1))


def test_engine_layout_is_prompts_then_one_slot_a_row_per_step():
    bs, ctx, p = 3, dab.PROMPT_LEN + 4, dab.PROMPT_LEN
    order = dab.slot_order("engine", bs, ctx)
    for b in range(bs):
        assert order[b, :p].tolist() == list(range(b * p + 1, (b + 1) * p + 1))
        assert order[b, p:].tolist() == [bs * p + 1 + step * bs + b for step in range(ctx - p)]


def test_contiguous_rows_follow_each_other_and_shuffled_does_not():
    assert dab.slot_order("contiguous", 2, 3).tolist() == [[1, 2, 3], [4, 5, 6]]
    assert dab.slot_order("shuffled", 4, 64).reshape(-1).tolist() != list(range(1, 257))


def test_an_unknown_layout_is_refused():
    with pytest.raises(ValueError, match="unknown slot layout"):
        dab.slot_order("striped", 2, 3)
