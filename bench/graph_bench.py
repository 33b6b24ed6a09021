"""Decode/prefill benchmark: graphtop graph vs eager, FlashInfer vs torch-native, the HBM floor,
transformers' own decode, capture cost, and event-stream overhead — all measured side by side in one
run on one device, printed as a table of ratios and saved as JSON.

    python bench/graph_bench.py --out OUT_DIR [--shapes qwen3-0.6b,llama-3.1-8b] [--quick]

Step times are whole serving steps (schedule → forward → sample → events), timed across N steps with
one synchronize before and after; each step's own sampling sync is part of it, as in serving.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402

from graphtop.engine.config import EngineConfig  # noqa: E402
from graphtop.engine.engine import Engine  # noqa: E402
from graphtop.engine.telemetry.bus import EventBus  # noqa: E402
from graphtop.engine.graphs.config import GraphConfig  # noqa: E402
from graphtop.engine.sampling_params import SamplingParams  # noqa: E402
from graphtop.models.random_model import hf_config_for, random_checkpoint  # noqa: E402

PROMPT_LEN = 128
MAX_CONTEXT = 1088  # prompt 128 + decode, and a 1024-token prefill


def log(*a: Any) -> None:
    print(*a, flush=True)


def copy_bandwidth(device: torch.device) -> float:
    """Bytes/s of a large device-to-device copy, counting read + write."""
    n = 1 << 30  # 1 GiB
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        dst.copy_(src)
        e.record()
        e.synchronize()
        best = min(best, s.elapsed_time(e) / 1e3)
    del src, dst
    return 2 * n / best


def make_engine(ckpt: Any, attention: str, graphs: bool, bus: Optional[EventBus] = None,
                max_running: int = 256, gemv_rows: int = 1, **overrides: Any) -> Engine:
    gcfg = GraphConfig()
    if not graphs:
        gcfg.set("decode.backend", "disabled")
        gcfg.set("prefill.backend", "disabled")
    cfg = EngineConfig(device="cuda", dtype="bfloat16", attention_backend=attention, page_size=1,
                       chunked_prefill_size=1024, max_running_requests=max_running,
                       max_context_len=MAX_CONTEXT, max_total_tokens=max_running * 400 + 4096, graphs=gcfg,
                       fused_gemv_max_rows=gemv_rows, capture_before_serving=True, **overrides)
    return Engine(ckpt, cfg, bus)


def fill_decode(eng: Engine, bs: int, seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    vocab = eng.spec.vocab_size
    params = SamplingParams(max_new_tokens=MAX_CONTEXT - PROMPT_LEN - 2, ignore_eos=True, detokenize=False)
    handles = [eng.submit(torch.randint(10, vocab - 10, (PROMPT_LEN,), generator=g).tolist(), params)
               for _ in range(bs)]
    while any(len(h._token_ids) == 0 for h in handles):
        eng.step()
    return handles


def drain(eng: Engine, handles: list) -> None:
    for h in handles:
        eng.cancel(h.request_id)
    eng.run_until_idle()
    assert eng.pool.used_pages == 0, "KV pool not empty after drain"


def time_steps(eng: Engine, n: int) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        eng.step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3


def decode_ms(eng: Engine, bs: int, steps: int, eager_steps: int) -> dict[str, float]:
    handles = fill_decode(eng, bs)
    out: dict[str, float] = {}
    mr = eng.model_runner
    if mr.decode is not None and mr.decode.pick_bucket(bs) is not None:
        time_steps(eng, 5)
        out["graph"] = time_steps(eng, steps)
        # where a graph step's time goes: GPU replay (CUDA events) vs the rest (host)
        sub = eng.bus.subscribe("split", types={"step"})
        time_steps(eng, steps)
        evs = [e for e in sub.drain() if e.path == "graph"]
        eng.bus.unsubscribe(sub)
        if evs:
            out["replay_gpu_ms"] = statistics.mean(e.replay_ms for e in evs)
            out["host_ms"] = statistics.mean(e.host_ms for e in evs)
    saved, mr.decode = mr.decode, None
    try:
        time_steps(eng, 2)
        out["eager"] = time_steps(eng, eager_steps)
    finally:
        mr.decode = saved
    out["context"] = PROMPT_LEN + len(handles[0]._token_ids)
    drain(eng, handles)
    return out


def prefill_ms(eng: Engine, n_tokens: int, reps: int) -> dict[str, float]:
    g = torch.Generator().manual_seed(n_tokens)
    vocab = eng.spec.vocab_size
    params = SamplingParams(max_new_tokens=1, ignore_eos=True, detokenize=False)
    mr = eng.model_runner
    out: dict[str, float] = {}
    for label in ("graph", "eager"):
        saved = mr.prefill
        if label == "eager":
            mr.prefill = None
        elif saved is None or saved.pick_bucket(n_tokens) is None:
            continue
        try:
            times = []
            for i in range(reps + 2):
                eng.submit(torch.randint(10, vocab - 10, (n_tokens,), generator=g).tolist(), params)
                torch.cuda.synchronize()
                t = time.perf_counter()
                eng.step()
                torch.cuda.synchronize()
                if i >= 2:
                    times.append((time.perf_counter() - t) * 1e3)
                eng.run_until_idle()
            out[label] = statistics.median(times)
        finally:
            mr.prefill = saved
    return out


def events_overhead(eng: Engine, rounds: int, steps: int) -> dict[str, float]:
    """Decode step time at bs 1 with a trace recorder subscribed vs no subscriber, interleaved."""
    from graphtop.engine.telemetry.recorder import TraceRecorder

    handles = fill_decode(eng, 1)
    on, off = [], []
    for r in range(rounds):
        off.append(time_steps(eng, steps))
        path = Path(tempfile.mkdtemp()) / "trace.jsonl"
        rec = TraceRecorder(str(path), eng.bus, header_meta={"bench": "events_overhead"})
        on.append(time_steps(eng, steps))
        rec.close()
    drain(eng, handles)
    return {"off_ms": statistics.median(off), "on_ms": statistics.median(on),
            "ratio": statistics.median(on) / statistics.median(off)}


def hf_decode_ms(hf_config: Any, bs: int, steps: int) -> float:
    from transformers import AutoModelForCausalLM

    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16)
    model.eval()
    g = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(10, hf_config.vocab_size - 10, (bs, PROMPT_LEN), device="cuda", generator=g)
    with torch.inference_mode():
        out = model(ids, use_cache=True)
        past = out.past_key_values
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(3):
            out = model(nxt, past_key_values=past, use_cache=True)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(steps):
            out = model(nxt, past_key_values=past, use_cache=True)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            nxt.tolist()  # a serving loop reads tokens back every step
        torch.cuda.synchronize()
    ms = (time.perf_counter() - t) / steps * 1e3
    del model, out, past
    torch.cuda.empty_cache()
    return ms


def capture_stats(bus_sub: Any) -> dict[str, Any]:
    stats: dict[str, Any] = {}
    for e in bus_sub.drain():
        if e.type == "capture_finished":
            stats[e.phase] = {"seconds": e.seconds, "memory_bytes": e.memory_bytes,
                              "buckets": len(e.captured), "failed": list(e.failed)}
    return stats


def bench_shape(shape: str, args: argparse.Namespace, bw: float, attentions: list[str]) -> dict[str, Any]:
    overrides = {"num_hidden_layers": args.layers} if args.layers else {}
    hf_config = hf_config_for(shape, **overrides)
    ckpt = random_checkpoint(hf_config, device="cuda", dtype=torch.bfloat16)
    res: dict[str, Any] = {"shape": shape, "weights_bytes": ckpt.weights_bytes, "decode": {}, "prefill": {},
                           "capture": {}, "floor_ms": {}}
    kv_bytes_per_token = 2 * ckpt.spec.num_layers * ckpt.spec.num_kv_heads * ckpt.spec.head_dim * 2
    for attn in attentions:
        bus = EventBus()
        sub = bus.subscribe("bench", types={"capture_finished"})
        t = time.perf_counter()
        eng = make_engine(ckpt, attn, graphs=True, bus=bus)
        log(f"[{shape}/{attn}] engine ready in {time.perf_counter() - t:.1f} s")
        res["capture"][attn] = capture_stats(sub)
        bus.unsubscribe(sub)
        log(f"[{shape}/{attn}] capture {res['capture'][attn]}")
        for bs in args.bs:
            d = decode_ms(eng, bs, args.steps, args.eager_steps)
            res["decode"].setdefault(attn, {})[bs] = d
            ctx = d["context"]
            res["floor_ms"][bs] = (ckpt.weights_bytes + bs * ctx * kv_bytes_per_token) / bw * 1e3
            log(f"[{shape}/{attn}] decode bs {bs}: {d}  floor {res['floor_ms'][bs]:.3f} ms")
        for n in args.prefill:
            p = prefill_ms(eng, n, args.prefill_reps)
            res["prefill"].setdefault(attn, {})[n] = p
            log(f"[{shape}/{attn}] prefill {n}: {p}")
        if attn == attentions[0] and args.events:
            res["events"] = events_overhead(eng, rounds=5, steps=args.steps)
            log(f"[{shape}/{attn}] events overhead {res['events']}")
        eng.close()  # graphs and pool released now, before the next engine captures
        del eng
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    del ckpt
    torch.cuda.empty_cache()
    res["transformers"] = {}
    for bs in args.hf_bs:
        res["transformers"][bs] = hf_decode_ms(hf_config, bs, args.hf_steps)
        log(f"[{shape}] transformers decode bs {bs}: {res['transformers'][bs]:.3f} ms")
    return res


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| shape | attention | bs | graph ms | eager ms | eager/graph | HBM floor ms | graph/floor "
             "| transformers ms | transformers/graph |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for attn, by_bs in r["decode"].items():
            for bs, d in by_bs.items():
                g, e = d.get("graph"), d.get("eager")
                floor = r["floor_ms"][bs]
                hf = r["transformers"].get(bs)
                lines.append(
                    f"| {r['shape']} | {attn} | {bs} | {_f(g)} | {_f(e)} | {_r(e, g)} | {floor:.3f} | "
                    f"{_r(g, floor)} | {_f(hf)} | {_r(hf, g)} |"
                )
    lines += ["", "| shape | attention | prefill tokens | breakable ms | eager ms | eager/breakable |",
              "|---|---|---|---|---|---|"]
    for r in results:
        for attn, by_n in r["prefill"].items():
            for n, p in by_n.items():
                lines.append(f"| {r['shape']} | {attn} | {n} | {_f(p.get('graph'))} | {_f(p.get('eager'))} | "
                             f"{_r(p.get('eager'), p.get('graph'))} |")
    lines += ["", "| shape | attention | phase | buckets | capture s | graph memory MiB |", "|---|---|---|---|---|---|"]
    for r in results:
        for attn, phases in r["capture"].items():
            for phase, c in phases.items():
                lines.append(f"| {r['shape']} | {attn} | {phase} | {c['buckets']} | {c['seconds']:.2f} | "
                             f"{c['memory_bytes'] / 2**20:.0f} |")
    for r in results:
        if "events" in r:
            ev = r["events"]
            lines.append(f"\nevents on/off at bs 1 ({r['shape']}): {ev['on_ms']:.4f} / {ev['off_ms']:.4f} ms "
                         f"= {ev['ratio']:.4f}")
    return "\n".join(lines)


def _f(v: Optional[float]) -> str:
    return "–" if v is None else f"{v:.3f}"


def _r(a: Optional[float], b: Optional[float]) -> str:
    return "–" if a is None or b is None or b == 0 else f"{a / b:.2f}×"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    ap.add_argument("--shapes", default="qwen3-0.6b,llama-3.1-8b")
    ap.add_argument("--attention", default="flashinfer,torch")
    ap.add_argument("--bs", default="1,8,64,256")
    ap.add_argument("--prefill", default="64,256,1024")
    ap.add_argument("--hf-bs", default="1,64")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--eager-steps", type=int, default=10)
    ap.add_argument("--hf-steps", type=int, default=10)
    ap.add_argument("--prefill-reps", type=int, default=5)
    ap.add_argument("--layers", type=int, default=0, help="override layer count (quick runs)")
    ap.add_argument("--no-events", dest="events", action="store_false")
    args = ap.parse_args()
    args.bs = [int(x) for x in args.bs.split(",") if x]
    args.prefill = [int(x) for x in args.prefill.split(",") if x]
    args.hf_bs = [int(x) for x in args.hf_bs.split(",") if x]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        print("graph_bench: needs a CUDA device", file=sys.stderr)
        return 2
    attentions = [a for a in args.attention.split(",") if a]
    try:
        import flashinfer  # noqa: F401
    except Exception as e:
        log(f"flashinfer not importable ({e}); torch-native only")
        attentions = [a for a in attentions if a != "flashinfer"]
    dev = torch.device("cuda")
    bw = copy_bandwidth(dev)
    log(f"device {torch.cuda.get_device_name(dev)}; copy bandwidth {bw / 1e12:.2f} TB/s")
    results = []
    for shape in [s for s in args.shapes.split(",") if s]:
        results.append(bench_shape(shape, args, bw, attentions))
        (out / "bench.json").write_text(json.dumps({"device": torch.cuda.get_device_name(dev),
                                                    "copy_bandwidth": bw, "results": results}, indent=1))
    md = table(results)
    (out / "bench.md").write_text(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
