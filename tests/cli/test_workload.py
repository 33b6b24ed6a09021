"""Synthetic workload: deterministic, distributions parse strictly, ids respect the vocab."""

from __future__ import annotations

import random
import statistics

import pytest

from graphtop.cli.workload import Dist, SyntheticRequest, SyntheticWorkload


def make(**kw: object) -> SyntheticWorkload:
    args: dict = dict(n=50, seed=7, prompt_len="uniform:4:64", output_len="fixed:16", vocab_size=1000)
    args.update(kw)
    return SyntheticWorkload(**args)


def test_deterministic_given_seed() -> None:
    a = make(arrival_rate=5.0).requests()
    b = make(arrival_rate=5.0).requests()
    assert a == b
    w = make()
    assert list(w) == list(w)  # iterating twice gives the same requests
    assert make(seed=8).requests() != a


def test_request_prompt_independent_of_n() -> None:
    small = make(n=3).requests()
    big = make(n=30).requests()
    assert small == big[:3]


def test_lengths_and_ids_in_range() -> None:
    avoid = {0, 1, 2, 500}
    reqs = make(n=200, low=0, avoid_ids=avoid).requests()
    assert [r.index for r in reqs] == list(range(200))
    for r in reqs:
        assert isinstance(r, SyntheticRequest)
        assert 4 <= len(r.prompt_token_ids) <= 64
        assert r.max_new_tokens == 16
        assert all(0 <= t < 1000 and t not in avoid for t in r.prompt_token_ids)
        assert r.arrival_s == 0.0  # no rate: everything at t=0


def test_low_and_mostly_avoided_vocab() -> None:
    # 10 ids in range, 8 avoided: sampled from the explicit allowed list
    reqs = make(n=5, vocab_size=20, low=10, avoid_ids=set(range(10, 18))).requests()
    assert {t for r in reqs for t in r.prompt_token_ids} <= {18, 19}
    with pytest.raises(ValueError, match="no token ids left"):
        make(vocab_size=12, low=10, avoid_ids={10, 11})
    with pytest.raises(ValueError, match="low"):
        make(vocab_size=10, low=10)


def test_poisson_arrivals() -> None:
    reqs = make(n=2000, arrival_rate=100.0, prompt_len="fixed:1").requests()
    times = [r.arrival_s for r in reqs]
    assert times[0] == 0.0
    assert times == sorted(times)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert statistics.mean(gaps) == pytest.approx(0.01, rel=0.1)  # mean gap 1/rate
    with pytest.raises(ValueError, match="arrival rate"):
        make(arrival_rate=0.0)


def test_max_total_tokens_clips() -> None:
    reqs = make(n=50, prompt_len="fixed:100", output_len="fixed:100", max_total_tokens=150).requests()
    for r in reqs:
        assert len(r.prompt_token_ids) == 100 and r.max_new_tokens == 50


@pytest.mark.parametrize(
    ("spec", "kind", "params"),
    [
        ("fixed:128", "fixed", (128,)),
        ("uniform:16:256", "uniform", (16, 256)),
        ("lognormal:100:0.5", "lognormal", (100.0, 0.5)),
        ("choice:16,64,256", "choice", (16, 64, 256)),
        (" Choice: 8 , 9 ", "choice", (8, 9)),
    ],
)
def test_dist_parse(spec: str, kind: str, params: tuple) -> None:
    d = Dist.parse(spec)
    assert (d.kind, d.params) == (kind, params)
    assert Dist.parse(str(d)) == d


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "fixed",
        "fixed:0",
        "fixed:1.5",
        "fixed:1:2",
        "uniform:10",
        "uniform:10:5",
        "uniform:0:5",
        "uniform:a:b",
        "lognormal:0:1",
        "lognormal:100:-1",
        "lognormal:x:1",
        "choice:",
        "choice:1,,x",
        "choice:0,4",
        "gauss:1:2",
    ],
)
def test_dist_parse_errors_are_one_line_value_errors(spec: str) -> None:
    with pytest.raises(ValueError) as info:
        Dist.parse(spec)
    msg = str(info.value)
    assert "\n" not in msg and repr(spec) in msg


def test_dist_samples() -> None:
    rng = random.Random(0)
    assert {Dist.parse("choice:16,64,256").sample(rng) for _ in range(300)} == {16, 64, 256}
    u = [Dist.parse("uniform:3:5").sample(rng) for _ in range(300)]
    assert set(u) == {3, 4, 5}
    ln = [Dist.parse("lognormal:200:0.8").sample(rng) for _ in range(20_000)]
    assert min(ln) >= 1
    assert statistics.mean(ln) == pytest.approx(200, rel=0.05)  # MEAN is the distribution's mean
    assert min(Dist.parse("lognormal:1:3").sample(rng) for _ in range(2000)) == 1  # clipped to >= 1


def test_bad_n() -> None:
    with pytest.raises(ValueError):
        make(n=-1)
    assert make(n=0).requests() == []
    assert "50 synthetic requests" in make().describe()
