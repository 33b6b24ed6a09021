"""Host time of a decode step at many running requests, without the model: what the step loop's
Python costs per step (scheduling, building the batch, delivering the tokens to the handles), which
the overlap schedule must hide behind the GPU's step.

Why: at a few hundred requests the per-request Python of a step adds up to milliseconds, as long as
a small model's whole GPU step. Measured on the CPU without a forward, so it runs anywhere; thread
CPU time, the minimum of several repetitions (a shared machine's noise only ever adds).

    python3 bench/host_step_bench.py [--bs 64,256] [--reps 7] [--steps 50]

Prints, per batch size, the scheduler's decode step plus the output processor's delivery of its
tokens: the part of a step's host work that is the same on every device (the runner's part depends on
the attention backend: FlashInfer's planning does not run here).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from graphtop.engine.config import EngineConfig  # noqa: E402
from graphtop.engine.engine import Engine  # noqa: E402
from graphtop.engine.graphs.config import GraphConfig  # noqa: E402
from graphtop.engine.sampling_params import SamplingParams  # noqa: E402
from graphtop.engine.telemetry.bus import EventBus  # noqa: E402
from graphtop.models.synthetic.random_model import hf_config_for, random_checkpoint  # noqa: E402

PROMPT = 128
HIDDEN = 64


def engine(bs: int) -> Engine:
    """``bs`` requests past their prefill on a tiny model whose forward returns zeros."""
    cfg = hf_config_for("qwen3-0.6b", num_hidden_layers=1, hidden_size=HIDDEN, intermediate_size=128,
                        num_attention_heads=2, num_key_value_heads=1, head_dim=32, vocab_size=512)
    ckpt = random_checkpoint(cfg, device="cpu", dtype=torch.float32)
    ckpt.model.forward = lambda input_ids, positions, attn: torch.zeros(input_ids.shape[0], HIDDEN)
    graphs = GraphConfig()
    graphs.set("decode.bs", [bs])
    graphs.set("prefill.backend", "disabled")
    cfg = EngineConfig(device="cpu", dtype="float32", attention_backend="torch", max_running_requests=bs,
                       max_context_len=4096, max_total_tokens=bs * 1200 + 4096, chunked_prefill_size=8192,
                       graphs=graphs, capture_before_serving=True)
    eng = Engine(ckpt, cfg, EventBus())
    params = SamplingParams(max_new_tokens=3000, ignore_eos=True, detokenize=False)
    handles = [eng.submit(list(range(10, 10 + PROMPT)), params) for _ in range(bs)]
    while any(not h.token_ids for h in handles):
        eng.step()
    return eng


def best_ms(fn, steps: int, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.thread_time()
        for _ in range(steps):
            fn()
        times.append((time.thread_time() - t) / steps * 1e3)
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bs", default="64,256")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_args()
    torch.set_num_threads(1)
    for bs in map(int, args.bs.split(",")):
        eng = engine(bs)
        tokens = [7] * bs

        def schedule_and_deliver() -> None:
            batch = eng.scheduler.schedule()
            eng.output.deliver(batch, tokens)

        sd = best_ms(schedule_and_deliver, args.steps, args.reps)
        print(f"bs {bs}: schedule + deliver {sd:.3f} ms a decode step (host CPU time)", flush=True)
        eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
