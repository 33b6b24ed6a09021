"""The bucket advisor's search is exact: it equals brute force over every list of observed sizes."""

from __future__ import annotations

import itertools
from typing import Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphtop.engine.graphs.bucket_advisor import advise, expected_cost


def brute_force(
    phase: str,
    demand: dict[int, int],
    *,
    eager_ratio: float,
    cap: Optional[float],
    max_graphs: Optional[int],
    memory: Optional[dict[int, float]],
    max_memory: Optional[float],
    max_bucket: Optional[int],
    cover: bool = False,
) -> float:
    """The cheapest cost over every subset of the observed sizes that fits the budget; with ``cover``
    (and graphs that pay, ratio > 1), over the subsets holding the largest allowed size when any fits."""
    sizes = sorted(s for s in demand if max_bucket is None or s <= max_bucket)
    best = {True: float("inf"), False: float("inf")}  # by: holds the largest allowed size
    for k in range(0, len(sizes) + 1):
        if max_graphs is not None and k > max_graphs:
            break
        for combo in itertools.combinations(sizes, k):
            if max_memory is not None and sum(memory[b] for b in combo) > max_memory:  # type: ignore[index]
                continue
            cost = expected_cost(phase, demand, combo, eager_ratio=eager_ratio, max_padding_waste=cap)
            holds = bool(combo) and combo[-1] == sizes[-1]
            best[holds] = min(best[holds], cost)
    if cover and eager_ratio > 1 and best[True] < float("inf"):
        return best[True]
    return min(best.values())


problems = st.fixed_dictionaries(
    {
        "demand": st.dictionaries(st.integers(1, 64), st.integers(1, 20), min_size=0, max_size=8),
        "eager_ratio": st.floats(0.25, 12.0),
        "cap": st.one_of(st.none(), st.floats(0.0, 0.9)),
        "max_graphs": st.one_of(st.none(), st.integers(0, 5)),
        "max_bucket": st.one_of(st.none(), st.integers(1, 64)),
        "memory_seed": st.lists(st.integers(0, 100), min_size=64, max_size=64),
        "max_memory": st.one_of(st.none(), st.integers(0, 300)),
        "cover": st.booleans(),
    }
)


@settings(max_examples=400, deadline=None)
@given(problems)
def test_advice_equals_brute_force(p) -> None:
    memory = {s: float(p["memory_seed"][s - 1]) for s in range(1, 65)}
    phase = "prefill" if p["cap"] is not None else "decode"
    kwargs = dict(
        eager_ratio=p["eager_ratio"],
        cap=p["cap"],
        max_graphs=p["max_graphs"],
        max_bucket=p["max_bucket"],
        max_memory=p["max_memory"],
        cover=p["cover"],
    )
    advice = advise(
        phase,
        p["demand"],
        eager_ratio=p["eager_ratio"],
        max_padding_waste=p["cap"],
        max_graphs=p["max_graphs"],
        max_memory=p["max_memory"],
        memory_of=memory.__getitem__,
        max_bucket=p["max_bucket"],
        cover_largest=p["cover"],
    )
    best = brute_force(phase, p["demand"], memory=memory, **kwargs)
    assert advice.cost == pytest.approx(best, rel=1e-9, abs=1e-9)
    # the advice itself is feasible, drawn from the observed sizes, and costs what it claims
    assert set(advice.buckets) <= set(p["demand"])
    if p["max_graphs"] is not None:
        assert len(advice.buckets) <= p["max_graphs"]
    if p["max_bucket"] is not None:
        assert all(b <= p["max_bucket"] for b in advice.buckets)
    assert advice.memory_bytes == pytest.approx(sum(memory[b] for b in advice.buckets))
    if p["max_memory"] is not None:
        assert advice.memory_bytes <= p["max_memory"]
    claimed = expected_cost(
        phase, p["demand"], advice.buckets, eager_ratio=p["eager_ratio"], max_padding_waste=p["cap"]
    )
    assert claimed == pytest.approx(advice.cost, rel=1e-9, abs=1e-9)
    assert advice.bucket_memory == tuple(memory[b] for b in advice.buckets)
    # covering: a size above the largest bucket is reported, with the budget that forced it
    top = advice.buckets[-1] if advice.buckets else 0
    if p["cover"] and p["eager_ratio"] > 1:
        assert advice.uncovered == tuple(sorted(s for s in p["demand"] if s > top))
        assert bool(advice.uncovered) == bool(advice.uncovered_because)
    else:
        assert advice.uncovered == () and advice.uncovered_because == ""


def test_the_memory_budget_changes_the_answer() -> None:
    demand = {3: 10, 8: 10, 30: 1}
    mem = {3: 10.0, 8: 20.0, 30: 100.0}
    free = advise("decode", demand, eager_ratio=4.0, memory_of=mem.__getitem__)
    assert free.buckets == (3, 8, 30) and free.memory_bytes == 130.0
    tight = advise("decode", demand, eager_ratio=4.0, max_memory=40.0, memory_of=mem.__getitem__)
    assert tight.buckets == (3, 8) and tight.memory_bytes == 30.0
    assert tight.cost == pytest.approx(3 * 10 + 8 * 10 + 4.0 * 30)


def test_the_padding_cap_refuses_what_it_refuses_at_runtime() -> None:
    # 10 tokens cannot pad to 40 under a 50 % cap: the bucket 40 does not serve it
    demand = {10: 5, 40: 5}
    one = advise("prefill", demand, eager_ratio=1.5, max_padding_waste=0.5, max_graphs=1)
    assert one.buckets == (40,)
    assert one.cost == pytest.approx(5 * 40 + 5 * 1.5 * 10)
    # without the cap, 40 would serve both (400) and padding 10 to 40 makes the small bucket better
    assert expected_cost("prefill", demand, (40,), eager_ratio=1.5) == pytest.approx(10 * 40)
    no_cap = advise("prefill", demand, eager_ratio=1.5, max_graphs=1)
    assert no_cap.buckets == (10,) and no_cap.cost == pytest.approx(5 * 10 + 5 * 1.5 * 40)


def test_ties_go_to_fewer_graphs_and_cheap_eager_needs_none() -> None:
    assert advise("decode", {4: 3}, eager_ratio=1.0).buckets == ()  # eager costs what a graph costs
    assert advise("decode", {4: 3}, eager_ratio=0.5).buckets == ()
    assert advise("decode", {4: 3, 5: 1}, eager_ratio=9.0, max_graphs=0).buckets == ()
    assert advise("decode", {}, eager_ratio=2.0).buckets == ()


def test_relative_cost_and_bad_arguments() -> None:
    a = advise("decode", {2: 1, 4: 1}, eager_ratio=3.0, max_graphs=1)
    assert a.buckets == (4,) and a.relative_cost == pytest.approx(8 / 6)
    with pytest.raises(ValueError):
        advise("decode", {2: 1}, eager_ratio=0.0)
    with pytest.raises(ValueError):
        advise("decode", {2: 1}, eager_ratio=2.0, max_memory=10.0)


def test_large_distributions_stay_fast_enough_to_run_on_every_keystroke() -> None:
    """Not a timing assertion: a few thousand distinct sizes and dozens of graphs must finish (the
    dashboard calls this on a key press), and the answer must still beat its own restrictions."""
    demand = {s: 1 + (s * 7919) % 13 for s in range(1, 1500)}
    wide = advise("prefill", demand, eager_ratio=1.5, max_padding_waste=0.25, max_graphs=24)
    narrow = advise("prefill", demand, eager_ratio=1.5, max_padding_waste=0.25, max_graphs=12)
    assert len(wide.buckets) <= 24 and wide.cost <= narrow.cost


def test_past_the_candidate_limit_buckets_come_from_a_spread_of_the_sizes(monkeypatch) -> None:
    """The search is quadratic in candidates: a trace with tens of thousands of distinct prefill sizes
    once took gigabytes and minutes. Past the limit every size is still costed, the largest stays a
    candidate, and the result equals the exact search over the thinned sizes."""
    from graphtop.engine.graphs import bucket_advisor

    monkeypatch.setattr(bucket_advisor, "MAX_CANDIDATES", 8)
    demand = {s: 1 + (s * 31) % 5 for s in range(1, 41)}
    got = advise("decode", demand, eager_ratio=3.0, max_graphs=3)
    kept = sorted(demand)
    thinned = [kept[i] for i in (0, 6, 11, 17, 22, 28, 33, 39)]  # linspace(0, 39, 8) rounded
    assert set(got.buckets) <= set(thinned) and max(demand) in thinned
    best = min(
        expected_cost("decode", demand, combo, eager_ratio=3.0, max_padding_waste=None)
        for k in range(4)
        for combo in itertools.combinations(thinned, k)
    )
    assert got.cost == pytest.approx(best)
    assert got.cost == pytest.approx(
        expected_cost("decode", demand, got.buckets, eager_ratio=3.0, max_padding_waste=None)
    )


def test_covering_keeps_the_largest_size_unless_a_budget_forbids_it() -> None:
    """A rare large size is cheaper eager under the cost model, but the workload needed it: covering
    keeps a bucket for it, and a memory budget that cannot hold it says so."""
    demand = {8: 100, 2048: 1}
    mem = {8: 1.0, 2048: 50.0}
    cheapest = advise("prefill", demand, eager_ratio=1.5, max_graphs=1)
    assert cheapest.buckets == (8,)  # 2048 left eager: cheaper by the model
    covered = advise("prefill", demand, eager_ratio=1.5, max_graphs=1, cover_largest=True)
    assert covered.buckets == (2048,) and covered.uncovered == ()
    two = advise("prefill", demand, eager_ratio=1.5, max_graphs=2, cover_largest=True)
    assert two.buckets == (8, 2048)
    tight = advise(
        "prefill", demand, eager_ratio=1.5, max_graphs=2, memory_of=mem.__getitem__, max_memory=10.0, cover_largest=True
    )
    assert tight.buckets == (8,) and tight.uncovered == (2048,)
    assert "memory budget" in tight.uncovered_because
    capped = advise("prefill", demand, eager_ratio=1.5, max_bucket=1024, cover_largest=True)
    assert capped.buckets == (8,) and "largest bucket allowed" in capped.uncovered_because
    none = advise("prefill", demand, eager_ratio=1.5, max_graphs=0, cover_largest=True)
    assert none.buckets == () and none.uncovered_because == "the graph budget is 0"
