"""Advice that generalises: chosen on the earlier steps, scored on later ones it never saw.

The acceptance case: on a synthetic trace whose later requests come from the same distribution, the
advice's held-out cost is within 5 % of its training cost, and so is its cost on a fresh sample of
that distribution. The exact-fit advice of a short trace (the lengths seen, nothing else) does not
generalise; the held-out choice never picks a grid that does worse on the held-out steps.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from graphtop.engine.graphs.bucket_advisor import advise
from graphtop.engine.graphs.bucket_demand import advise_phase, held_out_cut
from graphtop.engine.graphs.bucket_holdout import advise_held_out, relative_cost
from graphtop.engine.telemetry.events import StepEvent


def _prefills(rng: np.random.Generator, n: int) -> list[StepEvent]:
    """Prompts of lognormal lengths (median 200 tokens), recorded as eager steps over a small list."""
    sizes = np.clip(rng.lognormal(np.log(200), 0.8, n).astype(int), 1, 2048)
    return [
        StepEvent(
            step=i,
            phase="prefill",
            batch_size=1,
            num_tokens=int(t),
            path="eager",
            fallback_reason="prefill_tokens_over_max_bucket",
            ts=float(i),
        )
        for i, t in enumerate(sizes)
    ]


def _decodes(rng: np.random.Generator, n: int) -> list[StepEvent]:
    sizes = np.clip(rng.poisson(12, n), 1, 64)
    return [
        StepEvent(
            step=i,
            phase="decode",
            batch_size=int(b),
            num_tokens=int(b),
            path="eager",
            fallback_reason="not_yet_captured",
            ts=float(i),
        )
        for i, b in enumerate(sizes)
    ]


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_held_out_cost_is_within_five_percent_of_training_cost(phase: str) -> None:
    make = _prefills if phase == "prefill" else _decodes
    steps = make(np.random.default_rng(1), 600)
    cap = 0.25 if phase == "prefill" else None
    current = [64, 256, 1024] if phase == "prefill" else [1, 2, 4, 8]
    advice, demand = advise_phase(steps, phase, max_padding_waste=cap, current=current, max_graphs=4)
    held = advice.held_out
    assert held is not None and held.held_steps == 150 and held.train_steps == 450
    assert abs(held.advice_held - held.advice_train) <= 0.05 * held.advice_train, held
    # requests the trace never saw, from the same distribution, cost what training promised
    fresh = Counter(s.num_tokens for s in make(np.random.default_rng(99), 3000))
    cost = relative_cost(phase, fresh, advice.buckets, eager_ratio=demand.ratio.value, max_padding_waste=cap)
    assert abs(cost - held.advice_train) <= 0.05 * held.advice_train, (cost, held)
    # and the advice beats the lists in use on the held-out part, with the same number of graphs
    assert held.now_held is not None and held.advice_held < held.now_held and held.gain > 0
    assert len(advice.buckets) <= 4 and all(b % held.grid == 0 for b in advice.buckets)


def test_the_chosen_grid_does_best_on_the_held_out_steps() -> None:
    """A short trace (30 prompts) fitted exactly advises the lengths it saw; the held-out choice
    takes the grid whose list did best on the later prompts, coarsest among near-ties."""
    steps = _prefills(np.random.default_rng(3), 30)
    advice, _ = advise_phase(steps, "prefill", max_padding_waste=0.25, current=[64, 256, 1024], max_graphs=4)
    held = advice.held_out
    assert held is not None
    best = min(c for _, c in held.by_grid)
    assert dict(held.by_grid)[held.grid] <= best * 1.01
    assert all(c > best * 1.01 for g, c in held.by_grid if g > held.grid)
    # the final advice covers the largest prompt of the whole trace, held-out part included
    assert advice.buckets[-1] >= max(s.num_tokens for s in steps)


def test_grid_buckets_are_multiples_and_the_search_stays_exact_over_them() -> None:
    demand = {5: 3, 17: 4, 30: 2, 70: 1}
    a = advise("prefill", demand, eager_ratio=2.0, grid=16, max_graphs=2, cover_largest=True)
    assert a.buckets[-1] == 80 and all(b % 16 == 0 for b in a.buckets)
    grid_points = [16, 32, 80]  # the multiple of 16 just above each asked size
    from itertools import combinations

    from graphtop.engine.graphs.bucket_advisor import expected_cost

    best = min(
        expected_cost("prefill", demand, c, eager_ratio=2.0)
        for k in (1, 2)
        for c in combinations(grid_points, k)
        if 80 in c
    )
    assert a.cost == pytest.approx(best)
    # the static buffers' size stands in for a grid point past it
    capped = advise("prefill", demand, eager_ratio=2.0, grid=16, max_bucket=75, cover_largest=True)
    assert capped.buckets[-1] == 75 and capped.uncovered == ()
    with pytest.raises(ValueError):
        advise("prefill", demand, eager_ratio=2.0, grid=0)


def test_too_few_steps_hold_nothing_out() -> None:
    assert held_out_cut(10, 0.25) == 10  # 2.5 steps: below the minimum, nothing held out
    assert held_out_cut(100, 0.25) == 75 and held_out_cut(100, 0.0) == 100
    with pytest.raises(ValueError):
        held_out_cut(10, 1.0)
    a = advise_held_out("decode", {4: 3}, {}, eager_ratio=4.0, grids=(1, 8))
    assert a.held_out is None and a.buckets == (4,)


def test_live_advice_keeps_the_largest_bucket_in_use() -> None:
    """A window of short prompts must not advise away the graph of the long ones it has not seen."""
    demand = {10: 5, 20: 5, 30: 5}
    a = advise("prefill", demand, eager_ratio=1.5, max_graphs=3, cover_largest=True, largest_at_least=1024)
    assert a.buckets[-1] == 1024 and len(a.buckets) == 3 and a.uncovered == ()
    capped = advise("prefill", demand, eager_ratio=1.5, cover_largest=True, largest_at_least=1024, max_bucket=512)
    assert capped.buckets[-1] == 512
