"""GPU parity checks (``-m cuda``): real CUDA graphs, the eager re-run on its own stream and thread.

The same acceptance as tests/engine/test_parity.py on the CPU, on the device: checks agree on healthy graphs
(torch-native and FlashInfer attention, decode and breakable prefill graphs), never change an output
token, and catch a static buffer gone stale after capture, by stale contents or a stale address.
"""

from __future__ import annotations

import dataclasses
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from graphtop.engine.config import EngineConfig  # noqa: E402
from graphtop.engine.engine import Engine  # noqa: E402
from graphtop.engine.graphs.buffers import PaddingPolicy  # noqa: E402
from graphtop.engine.graphs.config import build_graph_config  # noqa: E402
from graphtop.engine.sampling_params import SamplingParams  # noqa: E402
from graphtop.engine.telemetry import events as ev  # noqa: E402
from graphtop.engine.telemetry.bus import EventBus  # noqa: E402

GRAPHS = {"decode.bs": [1, 2, 4, 8], "prefill.num_tokens": [64, 128, 256]}
LENS = [(40, 24), (100, 30), (7, 20), (230, 16), (64, 28), (150, 12)]  # (prompt, new tokens)


@pytest.fixture(scope="module")
def ckpt():
    from graphtop.models.synthetic.random_model import hf_config_for, random_checkpoint

    return random_checkpoint(hf_config_for("qwen3-0.6b", num_hidden_layers=8), device="cuda", dtype=torch.bfloat16)


def _attention(name: str) -> str:
    if name == "flashinfer":
        pytest.importorskip("flashinfer")
    return name


def _engine(ckpt, attention: str, bus: EventBus, **kw) -> Engine:
    cfg = EngineConfig(
        device="cuda",
        dtype="bfloat16",
        attention_backend=attention,
        max_context_len=1024,
        max_total_tokens=32 * 1024,
        max_running_requests=8,
        chunked_prefill_size=256,
        graphs=build_graph_config(None, GRAPHS),
        capture_before_serving=True,
        **kw,
    )
    return Engine(ckpt, cfg, bus)


def _serve(engine: Engine, settle: bool = False) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    vocab = engine.spec.vocab_size
    handles, pending = [], list(LENS)
    while pending or engine.scheduler.has_work():
        if pending:
            n, m = pending.pop(0)
            ids = torch.randint(10, vocab - 10, (n,), generator=g).tolist()
            handles.append(engine.submit(ids, SamplingParams(max_new_tokens=m, ignore_eos=True, detokenize=False)))
        for _ in range(2):
            engine.step()
            if settle:
                engine.parity.wait_idle()
    engine.parity.wait_idle()
    return [h.token_ids for h in handles]


def _checks(sub) -> list[ev.ParityCheck]:
    return [e for e in sub.drain() if isinstance(e, ev.ParityCheck)]


@pytest.mark.parametrize("attention", ["torch", "flashinfer"])
def test_checks_agree_and_change_no_token(ckpt, attention) -> None:
    attention = _attention(attention)
    plain = _engine(ckpt, attention, EventBus())
    expected = _serve(plain)
    plain.close()
    for settle in (False, True):
        bus = EventBus()
        sub = bus.subscribe("t", types={"parity_check", "error"})
        engine = _engine(ckpt, attention, bus, parity_every=1)
        assert _serve(engine, settle) == expected
        engine.close()
        events = sub.drain()
        assert not [e for e in events if isinstance(e, ev.ErrorEvent)], events
        checks = [e for e in events if isinstance(e, ev.ParityCheck)]
        worst = max(c.max_rel_err for c in checks)
        print(f"{attention} settle={settle}: {len(checks)} checks, worst rel err {worst:.4g}")
        assert checks and not any(c.mismatch for c in checks), checks
        if settle:
            assert {c.phase for c in checks} == {"decode", "prefill"}


@pytest.mark.parametrize("attention", ["torch", "flashinfer"])
@pytest.mark.parametrize(
    "phase, slot, how",
    [
        ("decode", "positions", "contents"),
        ("decode", "positions", "address"),
        ("prefill", "input_ids", "contents"),
        ("prefill", "input_ids", "address"),
    ],
)
def test_a_stale_static_buffer_is_caught(ckpt, attention, phase, slot, how) -> None:
    attention = _attention(attention)
    bus = EventBus()
    sub = bus.subscribe("t", types={"parity_check"})
    engine = _engine(ckpt, attention, bus, parity_every=1)
    registry = (engine.model_runner.decode if phase == "decode" else engine.model_runner.prefill).registry
    if how == "contents":  # the runner stops refreshing it: the graph reads what capture left there
        registry.slots[slot] = dataclasses.replace(registry.slots[slot], policy=PaddingPolicy.FILL_ONCE)
    else:  # the runner writes a new tensor; the captured graph still reads the old one, whose contents
        # stay what they were (kept alive here: a freed buffer could be reused, and the graph would read
        # whatever lands there, e.g. positions past the RoPE table)
        stale = registry.buffers[slot]
        registry.buffers[slot] = torch.zeros_like(stale)
    _serve(engine, settle=True)
    engine.close()
    if how == "address":
        del stale
    bad = [c for c in _checks(sub) if c.mismatch]
    assert bad and {c.phase for c in bad} == {phase}
