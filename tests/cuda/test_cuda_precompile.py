"""Kernels compiled ahead of capture on a real GPU: a cold start compiles every bucket's Triton kernels in
worker processes and captures every bucket; a second start on the same cache folder compiles nothing,
dry-runs nothing (the variant manifest) and loads every kernel from disk.

Each start runs in a process of its own: Triton keeps compiled kernels in memory per process, so only a
new process sees a cold (then a warm) cache as a fresh machine would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

START = r"""
import json, sys, torch
from graphtop.engine.config import EngineConfig
from graphtop.engine.engine import Engine
from graphtop.engine.graphs.config import GraphConfig
from graphtop.engine.sampling_params import SamplingParams
from graphtop.engine.telemetry.bus import EventBus
from graphtop.models.synthetic.random_model import hf_config_for, random_checkpoint

ckpt = random_checkpoint(hf_config_for("qwen3-0.6b", num_hidden_layers=2), device="cuda", dtype=torch.bfloat16)
bus = EventBus()
sub = bus.subscribe("test")
graphs = GraphConfig(decode_bs=[1, 2, 4, 8], prefill_num_tokens=[16, 32, 64])
config = EngineConfig(device="cuda", dtype="bfloat16", max_total_tokens=8192, chunked_prefill_size=64,
                      max_running_requests=8, graphs=graphs, cache_dir=sys.argv[1])
eng = Engine(ckpt, config, bus)
handles = [eng.submit(list(range(10, 10 + n)), SamplingParams(max_new_tokens=16, ignore_eos=True)) for n in (5, 17, 40)]
eng.run_until_done(handles)
eng.wait_for_capture(timeout=600)
steps = [e for e in sub.drain() if e.type in ("step", "capture_finished")]
eng.close()
print(json.dumps([e.to_dict() for e in steps]))
"""


def start(cache: Path) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_CACHE_DIR", "GRAPHTOP_PRECOMPILE")}
    done = subprocess.run(
        [sys.executable, "-c", START, str(cache)], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_cold_start_compiles_ahead_and_a_warm_one_loads_everything(tmp_path):
    pytest.importorskip("triton")
    cold = start(tmp_path)
    finished = {e["phase"]: e for e in cold if e["type"] == "capture_finished"}
    assert set(finished) == {"decode", "prefill"}
    assert all(e["ok"] and e["kernels_compiled"] > 0 for e in finished.values()), finished
    reasons = {e["fallback_reason"] for e in cold if e["type"] == "step" and e["path"] == "eager"}
    assert reasons <= {"kernels_compiling", "not_yet_captured"}, reasons
    assert any(e["forward_ms"] is not None for e in cold if e["type"] == "step" and e["path"] == "eager")
    assert list((tmp_path / "triton" / "graphtop-manifests").glob("*.json"))

    warm = start(tmp_path)
    finished = {e["phase"]: e for e in warm if e["type"] == "capture_finished"}
    assert all(e["ok"] and e["kernels_compiled"] == 0 and e["kernels_cached"] > 0 for e in finished.values())
    assert {e["fallback_reason"] for e in warm if e["type"] == "step"} <= {None, "not_yet_captured"}
