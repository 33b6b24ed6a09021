"""Auto-tune: re-advise on a schedule while serving, recapture when the held-out gain pays, and leave
the tokens exactly as a run without it.

A workload that shifts from short to long prompts midway runs on the emulated graphs with lists that
fit neither half well; the tuner is driven step by step (``tick``, a fake clock) so the schedule is the
same on every run. It recaptures at least once, never more often than its interval, every recapture is
a ``recapture_requested`` event with cause ``auto_tune`` and the metrics count it by cause; the greedy
tokens equal those of the same workload without auto-tune.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import logging

import pytest

from graphtop.engine.auto_tune import AutoTuneConfig, AutoTuner
from graphtop.engine.graphs.config import build_graph_config
from graphtop.engine.sampling_params import SamplingParams
from graphtop.engine.telemetry.bus import EventBus
from graphtop.engine.telemetry.events import RecaptureFinished, RecaptureRequested
from graphtop.engine.telemetry.metrics import MetricsCollector

pytestmark = pytest.mark.usefixtures("torch_one_thread")

INITIAL = {"decode.bs": [1, 2, 4, 8], "prefill.num_tokens": [8, 32, 64], "prefill.max_padding_waste": 0.5}


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _workload(engine, tuner=None, clock=None) -> list[list[int]]:
    """12 short prompts, then 12 long ones, one arriving every other step; greedy, fixed lengths."""
    lengths = [3 + (i * 5) % 9 for i in range(12)] + [40 + (i * 7) % 21 for i in range(12)]
    handles = []
    for i, n in enumerate(lengths):
        prompt = [10 + (i * 13 + j * 7) % 200 for j in range(n)]
        params = SamplingParams(max_new_tokens=6, ignore_eos=True, detokenize=False, temperature=0.0)
        handles.append(engine.submit(prompt, params))
        for _ in range(2):
            engine.step()
            if tuner is not None:
                clock.t += 1.0
                tuner.tick()
    while engine.step():
        if tuner is not None:
            clock.t += 1.0
            tuner.tick()
    assert all(h.finished for h in handles)
    return [h.token_ids for h in handles]


def test_auto_tune_recaptures_when_it_pays_and_keeps_the_tokens(tiny_ckpt, make_engine, caplog) -> None:
    path = tiny_ckpt("llama")
    plain = make_engine(path, graphs=build_graph_config(None, INITIAL))
    expected = _workload(plain)
    plain.close()

    bus = EventBus()
    events = bus.subscribe("test")
    metrics = MetricsCollector(bus)
    engine = make_engine(path, bus=bus, graphs=build_graph_config(None, INITIAL))
    clock = FakeClock()
    config = AutoTuneConfig(every_s=4.0, min_interval_s=20.0, threshold=0.02, window=256, min_steps=8)
    tuner = AutoTuner(engine, config, clock=clock)
    with caplog.at_level(logging.INFO, logger="graphtop.auto_tune"):
        got = _workload(engine, tuner, clock)
    engine.run_until_idle()
    tuner.drain()
    tuner.close()
    seen = events.drain()
    engine.close()

    assert got == expected  # graphs and recaptures never change a greedy token
    asked = [e for e in seen if isinstance(e, RecaptureRequested)]
    assert asked and all(e.cause == "auto_tune" and "step cost" in e.detail for e in asked)
    assert len(asked) == tuner.recaptures <= 1 + int(clock.t // config.min_interval_s)
    finished = [e for e in seen if isinstance(e, RecaptureFinished)]
    assert finished and all(e.ok for e in finished)
    assert sum("auto-tune: recapturing" in r.getMessage() for r in caplog.records) == len(asked)
    metrics.refresh()
    value = metrics.registry.get_sample_value("graphtop:recapture_requests_total", {"cause": "auto_tune"})
    metrics.close()
    assert value == len(asked)
    # the lists it chose stay within the static buffers and the graph counts in use
    last = finished[-1]
    assert len(last.decode_bs) <= 4 and max(last.decode_bs) <= 8
    assert len(last.prefill_num_tokens) <= 3 and max(last.prefill_num_tokens) <= 64


def test_thresholds_and_intervals_hold_it_back(tiny_ckpt, make_engine) -> None:
    engine = make_engine(tiny_ckpt("llama"), graphs=build_graph_config(None, INITIAL))
    clock = FakeClock()
    # a gain no list reaches: it re-advises on schedule and never recaptures
    never = AutoTuner(engine, AutoTuneConfig(every_s=1.0, min_interval_s=0.0, threshold=0.99, min_steps=8), clock=clock)
    # an interval longer than the run: one recapture at most, however often the advice pays
    once = AutoTuner(engine, AutoTuneConfig(every_s=1.0, min_interval_s=1e9, threshold=0.0, min_steps=8), clock=clock)

    class Both:
        def tick(self) -> None:
            never.tick()
            once.tick()

    _workload(engine, Both(), clock)
    never.close()
    once.close()
    engine.close()
    assert never.recaptures == 0 and once.recaptures == 1
    for bad in (dict(every_s=-1.0), dict(threshold=1.0), dict(max_memory=-1.0), dict(window=0), dict(min_steps=0)):
        with pytest.raises(ValueError):
            AutoTuneConfig(**bad)
