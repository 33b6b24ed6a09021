"""A mixture-of-experts model in the engine: its memory ledger shows the expert weights as a part of the
weights (a dense model's none), in the event the dashboard and traces read."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from graphtop.engine.telemetry.bus import EventBus

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "llama"])
def test_the_ledger_shows_the_expert_weights(tiny_ckpt, make_engine, family):
    bus = EventBus()
    sub = bus.subscribe("ledger", types=["memory_ledger"])
    engine = make_engine(tiny_ckpt(family), bus=bus, graphs=False)
    try:
        ledger = sub.drain()[-1]
        params = dict(engine.model.named_parameters())
        experts = sum(p.numel() * p.element_size() for n, p in params.items() if ".experts." in n)
        assert ledger.experts == experts and ledger.weights == engine.memory_plan.weights_bytes
        assert (0 < experts < ledger.weights) if family != "llama" else experts == 0
    finally:
        engine.close()
