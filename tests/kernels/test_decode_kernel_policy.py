"""Which decode-attention kernel ``KernelConfig.decode_kernel`` picks, by batch rows and GQA group
(``triton_rows_for``, the one home of that choice); runs without a GPU."""

from __future__ import annotations

import pytest

from graphtop.engine.attention.decode_policy import (
    TRITON_AUTO_GROUP,
    TRITON_AUTO_MAX_ROWS,
    triton_rows_for,
)


@pytest.mark.parametrize("group", [1, 2, 3])
def test_auto_small_groups_switch_to_flashinfer_above_the_limit(group):
    assert group < TRITON_AUTO_GROUP
    assert triton_rows_for("auto", group) == TRITON_AUTO_MAX_ROWS


@pytest.mark.parametrize("group", [4, 8, 16])
def test_auto_large_groups_keep_triton_at_every_size(group):
    assert group >= TRITON_AUTO_GROUP
    assert triton_rows_for("auto", group) >= 1 << 20


@pytest.mark.parametrize("kernel", ["flashinfer", "cuda-core", "tensor-core", "tensor-core-nosplit"])
def test_flashinfer_kernels_never_take_triton(kernel):
    assert triton_rows_for(kernel, 2) == triton_rows_for(kernel, 4) == 0


def test_triton_takes_every_size():
    assert triton_rows_for("triton", 2) == triton_rows_for("triton", 8) >= 1 << 20
