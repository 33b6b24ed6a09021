"""Greedy tokens pinned: the demo model (what graphtop loads without ``--model``) and SmolLM2-135M must
decode the same token ids as the engine did when these pins were written, eager and through emulated
graphs. A regression pin, not a reference: the ids were produced by graphtop itself, so it catches a
refactor that changes what the engine computes (sampling, batching, graphs, the prompt's tokenization),
while tests/models/test_smollm2.py checks SmolLM2 against transformers.

The demo model's random weights soon repeat one token under plain greedy decoding, so its pins also cover
greedy decoding through the sampler's penalties (PENALIZED), which keeps its tokens varied. The three
prompts are served as one batch (the decode buckets pad them, the padded rows must not leak).
SmolLM2's pins run only when its GGUF is there (``scripts/fetch_smollm2.py``; see tests/support/smollm2.py).

Regenerate after an intended change of the numbers (a new demo model, a new kernel) with
``PYTHONPATH=<checkout's graphtop parent> python3 tests/engine/test_greedy_pins.py`` from the repository
root, and paste the printed lists below; say in the commit why the tokens changed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

if __name__ == "__main__":  # run as a script: tests/ holds the support package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support.smollm2 import smollm2_gguf

PROMPTS = ("The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,")
MAX_NEW = 32
CONFIG = dict(device="cpu", dtype="float32", max_total_tokens=4096, max_running_requests=8, chunked_prefill_size=64)

PENALIZED = dict(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.25)

DEMO_PINS: list[list[int]] = [
    [
        348,
        348,
        348,
        348,
        348,
        348,
        348,
        348,
        348,
        348,
        348,
        348,
        348,
        348,
        348,
        348,
        348,
        348,
        348,
        348,
        348,
        348,
        348,
        348,
        348,
        348,
        348,
        348,
        348,
        348,
        348,
        348,
    ],
    [
        793,
        793,
        793,
        793,
        793,
        557,
        557,
        557,
        557,
        557,
        557,
        557,
        557,
        557,
        557,
        557,
        557,
        557,
        557,
        557,
        557,
        557,
        557,
        557,
        557,
        557,
        557,
        557,
        557,
        557,
        557,
        557,
    ],
    [
        883,
        883,
        883,
        883,
        883,
        883,
        883,
        883,
        883,
        883,
        883,
        883,
        883,
        883,
        883,
        883,
        883,
        883,
        883,
        883,
        883,
        883,
        883,
        883,
        883,
        883,
        883,
        883,
        883,
        883,
        883,
        883,
    ],
]
DEMO_PENALIZED_PINS: list[list[int]] = [
    [
        348,
        52,
        132,
        384,
        524,
        89,
        573,
        406,
        607,
        428,
        485,
        649,
        580,
        571,
        751,
        81,
        512,
        860,
        782,
        385,
        166,
        819,
        399,
        45,
        145,
        7,
        440,
        821,
        521,
        343,
        335,
        851,
    ],
    [
        727,
        147,
        877,
        608,
        233,
        405,
        651,
        176,
        495,
        435,
        148,
        27,
        479,
        325,
        590,
        896,
        686,
        933,
        208,
        261,
        846,
        932,
        12,
        220,
        663,
        826,
        455,
        1015,
        944,
        897,
        395,
        664,
    ],
    [
        883,
        574,
        603,
        504,
        19,
        757,
        846,
        122,
        899,
        229,
        988,
        570,
        525,
        307,
        453,
        766,
        997,
        849,
        611,
        1011,
        459,
        412,
        837,
        677,
        106,
        535,
        765,
        91,
        251,
        116,
        1019,
        247,
    ],
]
SMOLLM2_PINS: list[list[int]] = [
    [
        7042,
        30,
        198,
        198,
        504,
        2988,
        314,
        42,
        216,
        34,
        32,
        33,
        40,
        29,
        32,
        33,
        29,
        34,
        34,
        216,
        33,
        34,
        42,
        33,
        34,
        42,
        37,
        35,
        30,
        2,
    ],
    [
        472,
        585,
        304,
        1758,
        216,
        32,
        42,
        448,
        1003,
        216,
        33,
        472,
        1003,
        304,
        1672,
        3987,
        46477,
        24,
        94,
        731,
        216,
        33,
        25,
        198,
        198,
        19,
        4246,
        260,
        1517,
        198,
        3272,
        24,
    ],
    [
        665,
        436,
        253,
        9357,
        1573,
        267,
        19341,
        3365,
        3906,
        103,
        266,
        30,
        3906,
        103,
        266,
        436,
        1343,
        327,
        650,
        9077,
        6236,
        284,
        650,
        2606,
        327,
        260,
        1666,
        30,
        909,
        4161,
        281,
        253,
    ],
]


def greedy_tokens(model: Path, graphs: bool, bus=None, **params: float) -> list[list[int]]:
    """The PROMPTS served as one batch, greedy, MAX_NEW tokens each (fewer where the model ends one)."""
    from graphtop.engine import Engine, EngineConfig
    from graphtop.engine.graphs.config import GraphConfig
    from graphtop.engine.sampling_params import SamplingParams

    # small lists: a cheap emulated capture; the 36-token prefill of the demo prompts pads to 40
    lists = GraphConfig(decode_bs=[1, 2, 4], prefill_num_tokens=[16, 24, 32, 40, 48, 64])
    off = GraphConfig(decode_backend="disabled", prefill_backend="disabled")
    config = EngineConfig(graphs=lists if graphs else off, capture_before_serving=graphs, **CONFIG)
    engine = Engine.from_pretrained(model, config=config, bus=bus)
    try:
        handles = [engine.submit(p, SamplingParams(max_new_tokens=MAX_NEW, **params)) for p in PROMPTS]
        engine.run_until_idle()
        return [list(h.token_ids) for h in handles]
    finally:
        engine.close()


def demo_folder(cache: Path) -> Path:
    from graphtop.models.synthetic.demo import ensure_demo_model

    return ensure_demo_model(cache)


def smollm2_folder() -> Optional[Path]:
    from graphtop.models.checkpoint.gguf import gguf_folder

    gguf = smollm2_gguf()
    return gguf_folder(gguf) if gguf.is_file() else None


def _check(model: Path, graphs: bool, pins: list[list[int]], **params: float) -> None:
    from graphtop.engine.telemetry.bus import EventBus

    bus = EventBus()
    steps = bus.subscribe("steps", types=["step"])
    assert greedy_tokens(model, graphs, bus, **params) == pins
    paths = {(e.phase, e.path) for e in steps.drain()}
    if graphs:  # the pin covers the graph path only if both phases replayed
        assert {("prefill", "graph"), ("decode", "graph")} <= paths
    else:
        assert {p for _, p in paths} == {"eager"}


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_folder(tmp_path_factory.mktemp("pin-cache"))


@pytest.mark.usefixtures("torch_one_thread")
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "emulated-graphs"])
def test_demo_model_greedy_tokens_are_pinned(demo, graphs):
    _check(demo, graphs, DEMO_PINS)


@pytest.mark.usefixtures("torch_one_thread")
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "emulated-graphs"])
def test_demo_model_penalized_greedy_tokens_are_pinned(demo, graphs):
    _check(demo, graphs, DEMO_PENALIZED_PINS, **PENALIZED)


@pytest.mark.usefixtures("torch_one_thread")
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "emulated-graphs"])
def test_smollm2_greedy_tokens_are_pinned(graphs):
    folder = smollm2_folder()
    if folder is None:
        pytest.skip(f"SmolLM2 not fetched ({smollm2_gguf()}); run scripts/fetch_smollm2.py")
    _check(folder, graphs, SMOLLM2_PINS)


if __name__ == "__main__":
    import tempfile

    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as cache:
        folder = demo_folder(Path(cache))
        print("DEMO_PINS =", greedy_tokens(folder, graphs=False))
        print("DEMO_PENALIZED_PINS =", greedy_tokens(folder, graphs=False, **PENALIZED))
    smol = smollm2_folder()
    print("SMOLLM2_PINS =", greedy_tokens(smol, graphs=False) if smol else "(SmolLM2 not fetched)")
