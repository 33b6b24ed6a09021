"""The batched sampler: greedy rows are torch.argmax whatever shares the batch, the filter cuts what a
per-row loop cuts, samples follow the filtered softmax, and a step copies one tensor to the host."""

from __future__ import annotations

import inspect

import pytest
import torch

from graphtop.engine import sampler
from graphtop.engine.sampler import _MIN_TEMPERATURE, filter_logits, sample
from graphtop.engine.sampling_params import SamplingParams


class _Req:
    def __init__(self, params: SamplingParams) -> None:
        self.params, self.generator = params, None


def _reference(row: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The filter as a straightforward loop over one row: the sampler's former per-row code, with ties at
    the top-p boundary going to the lower token id (its unstable sort left that to the sort's implementation)."""
    row = row.float()
    row = (row - row.max()) / max(p.temperature, _MIN_TEMPERATURE)
    if 0 < p.top_k < row.shape[-1]:
        kth = torch.topk(row, p.top_k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))  # every token tied with the k-th stays
    if p.top_p < 1.0:
        sorted_logits, order = torch.sort(row, descending=True, stable=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        cum = torch.cumsum(probs, dim=-1)
        sorted_logits = sorted_logits.masked_fill(cum - probs > p.top_p, float("-inf"))
        row = torch.full_like(row, float("-inf")).scatter(0, order, sorted_logits)
    return row


def _random_params(g: torch.Generator, vocab: int) -> SamplingParams:
    def pick(options: list) -> object:
        return options[int(torch.randint(len(options), (1,), generator=g))]

    return SamplingParams(
        temperature=pick([1e-300, 1e-40, 1e-30, 1e-6, 0.3, 1.0, 2.5, 1e4, 1e30, 1e300]),
        top_k=pick([0, 1, 2, 3, 7, vocab - 1, vocab, vocab + 5]),
        top_p=pick([1.0, 0.999999, 0.95, 0.5, 0.2, 1e-6]),
    )


@pytest.mark.parametrize("ties", [False, True])
def test_filter_matches_a_per_row_loop(ties: bool) -> None:
    g = torch.Generator().manual_seed(1 + ties)
    vocab = 40
    for _ in range(30):
        logits = torch.randn(9, vocab, generator=g) * 4
        if ties:  # few distinct values: ties at the top-k value and across the top-p boundary
            logits = torch.randint(-3, 3, (9, vocab), generator=g).float()
        params = [_random_params(g, vocab) for _ in range(9)]
        got = filter_logits(logits, params)
        want = torch.stack([_reference(row, p) for row, p in zip(logits, params)])
        assert torch.equal(got, want), params
        alone = torch.cat([filter_logits(logits[i : i + 1], [p]) for i, p in enumerate(params)])
        assert torch.equal(alone, want)  # a row's cut does not depend on its neighbours' parameters


def test_top_k_keeps_ties_and_top_p_keeps_the_smallest_prefix() -> None:
    logits = torch.tensor([[3.0, 1.0, 3.0, 2.0, 2.0, 0.0]])
    kept = filter_logits(logits, [SamplingParams(temperature=1.0, top_k=3)]).isfinite()
    assert kept.tolist() == [[True, False, True, True, True, False]]  # the 3rd value (2.0) is tied
    three = torch.log(torch.tensor([[0.1, 0.6, 0.3]]))
    for top_p, n in [(0.1, 1), (0.55, 1), (0.65, 2), (0.85, 2), (0.95, 3)]:
        kept = filter_logits(three, [SamplingParams(temperature=1.0, top_p=top_p)]).isfinite()
        assert int(kept.sum()) == n, top_p


def test_extreme_temperatures_stay_finite() -> None:
    logits = torch.tensor([[1.0, 5.0, 5.0, -2.0]])
    cold = filter_logits(logits, [SamplingParams(temperature=1e-300)])
    assert torch.softmax(cold, dim=-1).tolist() == [[0.0, 0.5, 0.5, 0.0]]
    reqs = [_Req(SamplingParams(temperature=1e-300, seed=s)) for s in range(50)]
    assert set(sample(logits.expand(50, 4), reqs)) == {1, 2}  # only the tied top logits, never NaN
    hot = torch.softmax(filter_logits(logits, [SamplingParams(temperature=1e30)]), dim=-1)
    assert torch.allclose(hot, torch.full((1, 4), 0.25))


def _mixed(vocab: int) -> list[SamplingParams]:
    """A batch of every kind of row: greedy (two ways), sampled and seeded, with and without cuts."""
    return [
        SamplingParams(),
        SamplingParams(temperature=0.8, top_k=5, seed=3),
        SamplingParams(temperature=1.2),
        SamplingParams(temperature=0.5, top_k=1),  # top_k=1 is greedy
        SamplingParams(temperature=1.0, top_p=0.9),
        SamplingParams(temperature=0.7, top_p=0.5, top_k=vocab // 2, seed=11),
    ]


def test_greedy_rows_are_argmax_whatever_shares_the_batch() -> None:
    torch.manual_seed(0)
    vocab = 300
    for dtype in (torch.float32, torch.bfloat16):
        logits = torch.randn(6, vocab).to(dtype)
        logits[0, 7] = logits[0, 9] = logits[0].max() + 1  # a tie: argmax's first index
        params = _mixed(vocab)
        got = sample(logits, [_Req(p) for p in params])
        argmax = torch.argmax(logits, dim=-1).tolist()
        for i, p in enumerate(params):
            if p.greedy:
                assert got[i] == argmax[i]
                assert sample(logits[i : i + 1], [_Req(p)]) == [argmax[i]]  # alone
        assert got[0] == 7


def _frequencies(tokens: list[int], vocab: int) -> torch.Tensor:
    return torch.bincount(torch.tensor(tokens), minlength=vocab).double() / len(tokens)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_k=3),
        SamplingParams(temperature=1.5, top_p=0.8),
    ],
)
def test_samples_follow_the_filtered_softmax(params: SamplingParams) -> None:
    """Unseeded rows (the default generator, seeded here) and one seeded request over many steps both
    match the filtered softmax on a small vocabulary; cut tokens never come."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    want = torch.softmax(filter_logits(logits[None], [params])[0], dim=-1).double()
    torch.manual_seed(1234)
    n = 40_000
    free = sample(logits.expand(n, -1), [_Req(params) for _ in range(n)])
    assert (_frequencies(free, 6) - want).abs().max() < 0.012
    req = _Req(params.replace(seed=99))
    seeded = [sample(logits[None], [req])[0] for _ in range(4000)]
    assert (_frequencies(seeded, 6) - want).abs().max() < 0.03
    for tokens in (free, seeded):
        assert all(want[t] > 0 for t in set(tokens))


def test_no_item_and_one_host_copy_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``.item()`` (nor a conversion that syncs the same way); the tokens come back in one copy."""
    assert ".item(" not in inspect.getsource(sampler)
    copies = []
    real_cpu = torch.Tensor.cpu

    def forbidden(self: torch.Tensor, *args: object) -> object:
        raise AssertionError("a host sync in the sampler")

    def cpu(self: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        copies.append(tuple(self.shape))
        return real_cpu(self, *args, **kwargs)

    vocab = 50
    logits = torch.randn(6, vocab)
    params = _mixed(vocab)
    batches = [params, [p for p in params if p.greedy], [p for p in params if not p.greedy]]
    reqs = [[_Req(p) for p in batch] for batch in batches]
    for name in ("item", "__bool__", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, forbidden)
    monkeypatch.setattr(torch.Tensor, "cpu", cpu)
    for batch in reqs:
        copies.clear()
        got = sample(logits[: len(batch)], batch)
        assert len(got) == len(batch) and copies == [(len(batch),)]
