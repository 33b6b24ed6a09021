"""Live advice never throws away coverage the lists in use give for free.

A window of short prompts, advised alone, once spent a dense list's graphs on their exact sizes and
dropped the long buckets; the long prompts that followed ran eagerly. The property pinned here: a
proposal drops a bucket of the current list only when the window needs its slot (the graph count)
or the memory budget forces it; every size the current list served stays served while the budget
has room.
"""

from __future__ import annotations

import numpy as np

from graphtop.engine.graphs.bucket_policy import BucketPolicy
from graphtop.engine.graphs.live_advice import propose
from graphtop.engine.graphs.spare_graphs import keep_current, spread_cost
from graphtop.engine.telemetry.capture import BucketCost
from graphtop.engine.telemetry.events import StepEvent

CAP = 0.25
DENSE = [4, 8, 12, 16, 20, 24, 28, 32, 48, 64, 96, 128, 192, 256, 384, 512, 640, 768, 896, 1024]


def _short_prefills(n: int) -> list[StepEvent]:
    """Short prompts (8-64 tokens) as the dense list served them (eager where the padding cap refused)."""
    policy = BucketPolicy.of("prefill", DENSE, max_padding_waste=CAP)
    sizes = np.random.default_rng(3).integers(8, 65, n)
    out = []
    for i, t in enumerate(int(x) for x in sizes):
        d = policy.decide(t)
        reason = None if d.graph else d.reason.value  # type: ignore[union-attr]
        path = "graph" if d.graph else "eager"
        out.append(
            StepEvent(
                step=i,
                phase="prefill",
                batch_size=1,
                num_tokens=t,
                bucket=d.bucket,
                padded=d.padded,
                path=path,
                fallback_reason=reason,
                ts=i,
            )
        )
    return out


def _served(buckets: list[int], size: int) -> bool:
    return BucketPolicy.of("prefill", buckets, max_padding_waste=CAP).decide(size).graph


def _propose(current: list[int], costs: tuple[BucketCost, ...] = (), max_memory=None):
    return propose(
        {"prefill": _short_prefills(400)},
        {"prefill": current},
        costs,
        max_padding_waste=CAP,
        max_bucket={"prefill": max(current)},
        max_memory=max_memory,
        threshold=0.0,
    )


def test_a_short_window_keeps_every_long_size_the_dense_list_served() -> None:
    proposal = _propose(DENSE)
    assert proposal is not None  # the window still gains: exact short sizes
    new = proposal.buckets("prefill")
    assert new is not None and len(new) <= len(DENSE)
    dropped = set(DENSE) - set(new)
    # a current bucket leaves only to make room: the list is at its graph count
    assert not dropped or len(new) == len(DENSE)
    # no long prompt the dense list served is sent to the eager path (the window never saw one)
    lost = [s for s in range(129, 1025) if _served(DENSE, s) and not _served(new, s)]
    assert lost == []
    # and what the window asked for is served at least as well as before
    held = proposal.phases[0]
    assert held.gain > 0


def test_spare_graphs_fill_the_ranges_the_advice_leaves_coarse() -> None:
    # 25 serves what 24 and 28 served; 512 fills the gap between 25 and 1024
    kept = keep_current([25, 1024], [24, 28, 512, 1024], max_graphs=3, eager_ratio=1.5, max_padding_waste=CAP)
    assert kept == (25, 512, 1024)
    # room for all: every current bucket stays
    kept = keep_current([25, 1024], [24, 28, 512, 1024], max_graphs=8, eager_ratio=1.5, max_padding_waste=CAP)
    assert kept == (24, 25, 28, 512, 1024)
    # the advice already uses the graph count: nothing is added
    assert keep_current([25, 40, 1024], [512], max_graphs=3, eager_ratio=1.5) == (25, 40, 1024)


def test_only_the_memory_budget_drops_coverage() -> None:
    def mem(b: int) -> float:
        return float(b)

    # 1024 + 25 = 1049 bytes of advice; 640 more would pass a budget of 1600, 512 fits
    kept = keep_current(
        [25, 1024],
        [512, 640, 1024],
        max_graphs=8,
        eager_ratio=1.5,
        max_padding_waste=CAP,
        max_memory=1600,
        memory_of=mem,
    )
    assert kept == (25, 512, 1024)
    assert sum(mem(b) for b in kept) <= 1600


def test_spread_cost_follows_the_runners_rule() -> None:
    # sizes 1..4 under [2, 4]: 2, 2, 4, 4 = 12; with a 25 % cap size 1 (50 % padding) and 3 (25 %) ...
    assert spread_cost([2, 4], 4, eager_ratio=2.0, max_padding_waste=None) == 12.0
    # size 1 pads 50 % of bucket 2: eager, 2 x 1; size 3 pads 25 %: allowed
    assert spread_cost([2, 4], 4, eager_ratio=2.0, max_padding_waste=0.25) == 2.0 + 2 + 4 + 4
    # no buckets: every size eager
    assert spread_cost([], 4, eager_ratio=2.0, max_padding_waste=None) == 20.0


def test_the_advice_spends_a_graph_only_where_it_pays() -> None:
    from graphtop.engine.graphs.bucket_advisor import advise

    # 100 steps of 64 tokens, one each of 60..63: the exact small sizes save a few tokens, far under 1 %
    demand = {64: 100, 60: 1, 61: 1, 62: 1, 63: 1}
    full = advise("prefill", demand, eager_ratio=1.5, max_graphs=5)
    lean = advise("prefill", demand, eager_ratio=1.5, max_graphs=5, min_graph_gain=0.01)
    assert len(full.buckets) == 5 and lean.buckets == (64,)
    assert lean.cost - full.cost <= 0.01 * full.ideal * 4
    # a graph that saves much is still spent
    demand = {64: 100, 32: 100}
    assert advise("prefill", demand, eager_ratio=1.5, max_graphs=5, min_graph_gain=0.01).buckets == (32, 64)
