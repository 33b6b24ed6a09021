"""GGUF files of Gemma 2, Gemma 3 and Phi-3 as llama.cpp's converter writes them (tensor names from gguf-py's
maps, Gemma's norms stored as 1 + w, Phi-3's stacked tensors and LongRoPE factor tensors): converted through
transformers, with the metadata its reader leaves out restored (models/checkpoint/gguf_metadata.py), they
serve the logits of the checkpoint they were made from."""

from __future__ import annotations

import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

pytest.importorskip("gguf")
pytest.importorskip("accelerate")

from support.gguf_files import build_family_gguf  # noqa: E402
from support.tiny_models import build_tiny_checkpoint  # noqa: E402

from graphtop.models import load_checkpoint  # noqa: E402
from graphtop.models.layers.reference_attention import ContiguousAttention  # noqa: E402

SHORT, LONG = [1.0 + 0.25 * i for i in range(8)], [3.0 + 0.5 * i for i in range(8)]
# llama.cpp keeps no query scale, Gemma 3's local RoPE base or its layer pattern: it uses head_dim ** -0.5,
# 10000 and five local layers in six, so the checkpoints here have those
GEMMA = dict(query_pre_attn_scalar=32, layer_types=None)
CASES = {
    "gemma2": ("gemma2", GEMMA, None, dict(attn_softcap=50.0, final_softcap=30.0, sliding_layers=(0,))),
    "gemma3-linear-global-rope": (
        "gemma3",
        dict(GEMMA, num_layers=6, rope_local_base_freq=10000.0, rope_scaling={"rope_type": "linear", "factor": 4.0}),
        None,
        dict(rope_scaling={"rope_type": "linear", "factor": 4.0}, sliding_layers=(0, 1, 2, 3, 4)),
    ),
    "phi3": ("phi3", {}, None, dict(sliding_layers=())),
    "phi3-partial-rotary-window": (
        "phi3",
        {"partial_rotary_factor": 0.5, "sliding_window": 16},
        None,
        dict(partial_rotary_factor=0.5, sliding_window=16),
    ),
    "phi3-longrope": (
        "phi3",
        {
            "rope_scaling": {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG},
            "original_max_position_embeddings": 128,
        },
        (SHORT, LONG, 128, math.sqrt(1 + math.log(256 / 128) / math.log(128))),
        dict(rope_type="longrope"),
    ),
}


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHTOP_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("case", CASES)
def test_a_family_gguf_serves_its_checkpoint_logits(tmp_path, case):
    from transformers import AutoModelForCausalLM

    family, overrides, long_factors, facts = CASES[case]
    folder = build_tiny_checkpoint(tmp_path, family, **overrides)
    loaded = load_checkpoint(build_family_gguf(folder, tmp_path / "m.gguf", family, long_factors=long_factors))
    source = load_checkpoint(folder).spec
    for key, value in facts.items():
        assert getattr(loaded.spec, key) == value, key
    for key in ("softmax_scale", "rotary_dim", "attn_softcap", "final_softcap", "local_rope_theta", "sliding_layers"):
        assert getattr(loaded.spec, key) == getattr(source, key), key
    ids = torch.randint(0, loaded.spec.vocab_size, (60,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()(ids[None]).logits[0]
        got = loaded.model.compute_logits(
            loaded.model(ids, torch.arange(60), ContiguousAttention.for_spec(loaded.spec))
        )
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
