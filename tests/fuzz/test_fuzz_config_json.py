"""Fuzz: config.json fields. A checkpoint folder whose config.json has any mix of wrong types, ranges,
non-finite numbers, huge sizes and nesting either loads or is refused with one CheckpointError line,
within the hang limit, before allocating more than the (here: 256 MiB) memory the device has."""

from __future__ import annotations

import json
import shutil

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from support.fuzz_support import (
    assert_one_line,
    awkward_text,
    deeply_nested,
    examples,
    json_values,
    no_hang,
    numbers,
    raw_literals,
    to_json,
)

import graphtop.models.checkpoint.capacity as capacity
from graphtop.models import CheckpointError, load_checkpoint

SIZE_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "sliding_window",
)
OTHER_KEYS = (
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
    "eos_token_id",
    "bos_token_id",
    "hidden_act",
    "architectures",
    "model_type",
    "torch_dtype",
    "dtype",
    "partial_rotary_factor",
    "unknown_key",
)
ROPE = st.fixed_dictionaries(
    {},
    optional={
        "rope_type": st.sampled_from(["default", "linear", "llama3", "yarn", "dynamic", "?"]),
        "type": st.sampled_from(["linear", "yarn"]),
        "factor": st.one_of(numbers, raw_literals),
        "low_freq_factor": numbers,
        "high_freq_factor": numbers,
        "original_max_position_embeddings": st.one_of(st.integers(-2, 4096), numbers),
        "rope_theta": numbers,
        "attention_factor": numbers,
        "beta_fast": numbers,
        "beta_slow": numbers,
        "mscale": numbers,
    },
)
near_sizes = st.one_of(
    st.sampled_from([0, 1, 2, 3, 4, 8, 16, 32, 63, 64, 128, 256, 512, -1]),
    st.integers(-5, 10**6),
    st.sampled_from([10**9, 2**31, 2**63, 10**30]),
)
values = st.one_of(
    near_sizes, numbers, raw_literals, st.booleans(), st.none(), awkward_text, json_values, deeply_nested, ROPE
)
PLAUSIBLE = {
    **{key: near_sizes for key in SIZE_KEYS},
    "rms_norm_eps": st.one_of(numbers, st.sampled_from([1e-6, 1e-5, 0.5])),
    "rope_theta": st.one_of(numbers, st.sampled_from([10000.0, 1e6, 1.0, 0.5])),
    "rope_scaling": st.one_of(st.none(), ROPE),
    "rope_parameters": st.one_of(st.none(), ROPE),
    "tie_word_embeddings": st.booleans(),
    "eos_token_id": st.one_of(near_sizes, st.lists(near_sizes, max_size=3)),
}
typed_edits = st.sampled_from(sorted(PLAUSIBLE)).flatmap(lambda k: PLAUSIBLE[k].map(lambda v: {k: v}))
edits = st.one_of(typed_edits, st.dictionaries(st.sampled_from(SIZE_KEYS + OTHER_KEYS), values, min_size=1, max_size=4))


@pytest.fixture(scope="module")
def folder(tiny_ckpt, tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz-ckpt") / "model"
    shutil.copytree(tiny_ckpt("llama"), path)
    return path


@pytest.fixture
def small_device(monkeypatch):
    """The device has 256 MiB: anything a fuzzed config sizes beyond that must be refused, not built."""
    monkeypatch.setattr(capacity, "available_bytes", lambda device: 256 << 20)


@settings(max_examples=examples(150))
@given(changes=edits)
def test_config_json_loads_or_is_one_line(folder, small_device, changes):
    original = (folder / "config.json").read_text()
    config = json.loads(original)
    config.update(changes)
    (folder / "config.json").write_text(to_json(config))
    try:
        with no_hang():
            loaded = load_checkpoint(folder)
    except CheckpointError as e:
        assert_one_line(str(e))
        assert str(folder) in str(e)
        # hypothesis's statistics must be UTF-8: a key with a lone surrogate is shown escaped
        event(f"refused: {str(e).split(':')[0][:40]}".encode("utf-8", "backslashreplace").decode("utf-8"))
    else:
        assert loaded.weights_bytes <= 256 << 20
        event("loaded")
    finally:
        (folder / "config.json").write_text(original)
