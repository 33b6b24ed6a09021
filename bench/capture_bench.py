"""Graph capture with and without the GC frozen (GraphBackend.capture_session: freeze, no collection), side by side.

Each round builds one engine with ``GraphConfig.freeze_gc`` on and one with it off (in alternating
order), reads the capture time of every phase from the engine's own ``capture_finished`` events, then
recaptures the same lists once and reads ``recapture_finished``. Prints the medians and the ratio
off ÷ on. ``--heap N`` keeps N extra long-lived Python objects alive, standing in for a big
application (a dashboard, a server) around the engine: a full collection walks all of them.

    python bench/capture_bench.py --device cuda [--shape qwen3-0.6b] [--rounds 5] [--heap 0]
    python bench/capture_bench.py --device cpu             # emulated graphs, a small Qwen3-shaped model
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402

from graphtop.engine.config import EngineConfig  # noqa: E402
from graphtop.engine.engine import Engine  # noqa: E402
from graphtop.engine.graphs.config import GraphConfig  # noqa: E402
from graphtop.engine.telemetry.bus import EventBus  # noqa: E402
from graphtop.models.synthetic.random_model import hf_config_for, random_checkpoint  # noqa: E402

# A CPU-sized Qwen3 (the emulated capture records each bucket's contract and runs one forward per phase).
CPU_SHAPE = dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, vocab_size=8192)


def capture_seconds(ckpt: Any, device: str, freeze_gc: bool, max_running: int, chunk: int) -> dict[str, float]:
    bus = EventBus()
    sub = bus.subscribe("capture", types={"capture_started", "capture_finished", "recapture_finished"})
    graphs = GraphConfig(freeze_gc=freeze_gc)
    cfg = EngineConfig(device=device, dtype="bfloat16" if device == "cuda" else "float32", page_size=1,
                       max_running_requests=max_running, chunked_prefill_size=chunk, max_context_len=2048,
                       max_total_tokens=max_running * 256 + chunk, graphs=graphs,
                       capture_before_serving=True)
    engine = Engine(ckpt, cfg, bus)
    engine.recapture(engine.decode_buckets, engine.prefill_buckets)
    engine.run_until_idle()
    out, reason = {}, {}
    for e in sub.drain():
        if e.type == "capture_started":
            reason[e.phase] = e.reason
        elif e.type == "capture_finished" and reason.get(e.phase) == "initial":
            out[f"{e.phase} capture"] = e.seconds
        elif e.type == "recapture_finished":
            out["recapture (both)"] = e.seconds
    engine.close()
    del engine
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shape", default="qwen3-0.6b")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--heap", type=int, default=0, help="extra long-lived Python objects kept alive")
    ap.add_argument("--max-running", type=int, default=None, help="decode buckets up to this (default 256 / 64)")
    ap.add_argument("--chunk", type=int, default=None, help="prefill buckets up to this (default 2048 / 512)")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    if cuda:
        ckpt = random_checkpoint(hf_config_for(args.shape), device="cuda", dtype=torch.bfloat16)
    else:
        torch.set_num_threads(1)  # a tiny model gains nothing from more; a shared host's noise shrinks
        ckpt = random_checkpoint(hf_config_for(args.shape, **CPU_SHAPE),
                                 device="cpu", dtype=torch.float32)
    max_running = args.max_running or (256 if cuda else 64)
    chunk = args.chunk or (2048 if cuda else 512)
    heap = [{"i": i} for i in range(args.heap)]  # noqa: F841 - alive for the whole run on purpose
    print(f"{args.device} {args.shape}{'' if cuda else ' (CPU-sized, emulated graphs)'}; decode buckets "
          f"up to {max_running}, prefill up to {chunk}; {args.heap} extra heap objects; {args.rounds} rounds",
          flush=True)
    times: dict[bool, dict[str, list[float]]] = {True: {}, False: {}}
    for r in range(args.rounds):
        for freeze in ((True, False) if r % 2 == 0 else (False, True)):
            for key, s in capture_seconds(ckpt, args.device, freeze, max_running, chunk).items():
                times[freeze].setdefault(key, []).append(s)
    print(f"{'':18}{'GC frozen s':>12}{'GC on s':>10}{'on ÷ frozen':>13}   (medians of {args.rounds})")
    for key in sorted(times[True]):
        on, off = statistics.median(times[True][key]), statistics.median(times[False][key])
        print(f"{key:18}{on:12.3f}{off:10.3f}{off / on:12.2f}×", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
