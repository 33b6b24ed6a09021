"""``graphtop --model FOLDER --prompts FILE --output FILE`` serves every family headless: the result lines hold
the tokens the Python API generates for the same checkpoint (emulated graphs, prompts past the window)."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
from support.cli_support import ENGINE_ARGS, run

from graphtop.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.usefixtures("torch_one_thread", "private_cache_dir")

FAMILIES = {
    "gemma2": ("gemma2", {}),
    "gemma3": ("gemma3", {}),
    "phi3": ("phi3", {"partial_rotary_factor": 0.5}),
    "mistral-window": ("mistral", {"sliding_window": 16}),
    "qwen2-window": ("qwen2", {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1}),
    "qwen3-moe": ("qwen3_moe", {}),
    "mixtral-window": ("mixtral", {"sliding_window": 16}),
}
PROMPTS = ["In a hole in the ground there lived a hobbit, not a nasty one", "Once upon a time"]


@pytest.mark.parametrize("case", FAMILIES)
def test_headless_run_serves_the_family(tiny_ckpt, tmp_path, capsys, make_engine, case):
    family, overrides = FAMILIES[case]
    ckpt = tiny_ckpt(family, **overrides)
    prompts, out_file = tmp_path / "p.txt", tmp_path / "out.jsonl"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    rc, out, err = run(
        capsys, "--model", ckpt, "--prompts", prompts, "--output", out_file, "--max-new-tokens", 24, *ENGINE_ARGS
    )
    assert rc == 0, err
    results = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert [r["prompt"] for r in results] == PROMPTS
    want = make_engine(ckpt).generate(PROMPTS, SamplingParams(max_new_tokens=24))
    assert [r["token_ids"] for r in results] == [h.token_ids for h in want]
    assert all(r["token_ids"] and r["finish_reason"] in ("length", "eos") for r in results)
