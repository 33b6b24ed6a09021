"""A request's 64-bit seed decides its samples on every device: the CPU generator keeps only 32 bits,
so seeds that differed only above bit 31 (1 and 2**32 + 1) used to sample the same tokens."""

from __future__ import annotations

import pytest
import torch

from graphtop.engine.sampler import generator_seed
from graphtop.engine.sampling_params import SamplingParams

CPU = torch.device("cpu")


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
