"""A request's 64-bit seed decides its samples on every device: the CPU generator keeps only 32 bits,
so seeds that differed only above bit 31 (1 and 2**32 + 1) used to sample the same tokens. And a seeded
request samples the same tokens whatever shares its batch."""

from __future__ import annotations

import pytest
import torch

from graphtop.engine.sampler import generator_seed, sample
from graphtop.engine.sampling_params import SamplingParams

CPU = torch.device("cpu")


class _Req:
    def __init__(self, params: SamplingParams) -> None:
        self.params, self.generator = params, None


def test_32_bit_seeds_pass_unchanged_and_larger_ones_are_mixed_down() -> None:
    assert [generator_seed(s, CPU) for s in (0, 1, 2**32 - 1)] == [0, 1, 2**32 - 1]
    big = [2**32, 2**32 + 1, 2**33 + 1, 2**63, 2**64 - 1]
    mixed = [generator_seed(s, CPU) for s in big]
    assert all(0 <= m < 2**32 for m in mixed) and len(set(mixed) | {0, 1}) == len(big) + 2
    assert generator_seed(2**63, torch.device("cuda")) == 2**63  # Philox takes all 64 bits


@pytest.mark.parametrize("low, high", [(1, 2**32 + 1), (0, 2**63)])
def test_seeds_that_differ_above_bit_31_sample_differently(make_engine, tiny_ckpt, low: int, high: int) -> None:
    engine = make_engine(tiny_ckpt("llama"), graphs=False)
    try:

        def tokens(seed: int) -> list[int]:
            (h,) = engine.generate(
                [[5, 6, 7]], SamplingParams(temperature=1.0, max_new_tokens=12, seed=seed, ignore_eos=True)
            )
            return h.token_ids

        assert tokens(high) == tokens(high)  # still deterministic
        assert tokens(low) != tokens(high)
    finally:
        engine.close()


def _steps(n: int, vocab: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(vocab, generator=g) * 3 for _ in range(n)]


def _run_seeded(target: SamplingParams, steps: list[torch.Tensor], neighbours: list[SamplingParams], at: int) -> list:
    """The target request's tokens over ``steps``, sampled at row ``at`` among ``neighbours``."""
    vocab = steps[0].shape[-1]
    req = _Req(target)
    others = [_Req(p) for p in neighbours]
    tokens = []
    for logits in steps:
        batch = others[:at] + [req] + others[at:]
        rows = torch.randn(len(batch), vocab) * 3
        rows[at] = logits
        tokens.append(sample(rows, batch)[at])
    return tokens


@pytest.mark.parametrize(
    "target",
    [
        SamplingParams(temperature=1.0, seed=5),
        SamplingParams(temperature=0.9, top_k=20, seed=2**40 + 5),
        SamplingParams(temperature=1.3, top_p=0.9, seed=0),
        SamplingParams(temperature=0.6, top_k=50, top_p=0.95, seed=2**64 - 1),
    ],
)
def test_seeded_tokens_do_not_depend_on_the_batch(target: SamplingParams) -> None:
    vocab = 200
    steps = _steps(25, vocab, seed=4)
    alone = _run_seeded(target, steps, [], 0)
    assert _run_seeded(target, steps, [], 0) == alone  # reproducible
    greedy = [SamplingParams(), SamplingParams(temperature=0.5, top_k=1)]
    sampled = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.5, top_p=0.3)]
    seeded = [SamplingParams(temperature=0.8, top_k=3, seed=5), SamplingParams(temperature=2.0, seed=6)]
    for neighbours, at in [
        (greedy, 1),
        (sampled, 0),
        (sampled, 2),
        (seeded, 1),
        (greedy + sampled + seeded, 3),
        (greedy + seeded + sampled + greedy, 6),
    ]:
        assert _run_seeded(target, steps, neighbours, at) == alone, (neighbours, at)
    other_seed = target.replace(seed=(target.seed + 1) % 2**64)
    assert _run_seeded(other_seed, steps, [], 0) != alone
