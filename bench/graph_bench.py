"""Decode/prefill benchmark: graphtop graph vs eager, FlashInfer vs torch-native, the HBM floor
(bench/harness.py), transformers' own decode (eager, and its step in a hand-captured CUDA graph),
capture cost, and event-stream overhead — all measured side by side in one run on one device,
printed as a table of ratios and saved as JSON.

    python3 bench/graph_bench.py --out OUT_DIR [--shapes qwen3-0.6b,llama-3.1-8b] [--bs 1,8,64,256]
        [--rounds 5] [--prefill 64,128,256,512,1024]
    python3 bench/graph_bench.py --events-only [--device cpu|cuda] [--shapes qwen3-0.6b] [--bs 1] [--steps 200]
        [--rounds 7]

Step times are whole serving steps (schedule → forward → sample → events), timed across N steps with
one synchronize before and after; each step's own sampling sync is part of it, as in serving. Graph
and eager decode of one batch alternate in rounds on the same live engine; figures are medians.

The event stream's overhead is the decode step time with a trace recorder subscribed ÷ with no subscriber:
rounds alternate off/on on the same engine, each timing a fresh batch over the same span of contexts, and
medians are compared. ``--events-only`` measures only that, per shape and batch size: on the CPU on the demo
model (emulated graphs), on CUDA on a random-weight model of each shape.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Optional

import torch
from harness import (
    EVENTS_PROMPT,
    PROMPT_LEN,
    comma_ints,
    copy_bandwidth,
    drain,
    events_overhead,
    fill_decode,
    floor_ms,
    fmt,
    interleaved,
    log,
    make_engine,
    md_table,
    random_ckpt,
    ratio,
    refuse_past_context,
    release_cuda,
    sync_for,
    time_steps,
    write_json,
    write_text,
)

from graphtop.engine.engine import Engine
from graphtop.engine.sampling_params import SamplingParams
from graphtop.engine.telemetry.bus import EventBus


def decode_run_context(steps: int, eager_steps: int, rounds: int) -> int:
    """A request's context at ``decode_ms``'s last step: the prompt, the prefill's token, 5 warm-up steps,
    every round's graph steps, one eager warm-up and eager steps, then the replay split's steps. The KV
    pool must hold that for every row, or the last rounds would run preempted or on fewer rows while
    the floor counts them all."""
    return PROMPT_LEN + 1 + 5 + rounds * (steps + 1 + eager_steps) + steps


def decode_ms(eng: Engine, bs: int, steps: int, eager_steps: int, rounds: int) -> dict[str, Any]:
    """Graph and eager decode of the same ``bs`` requests on one live engine, in interleaved rounds
    (graph, eager, graph, ...), so context growth and clock drift hit both alike; medians."""
    handles = fill_decode(eng, bs)
    out: dict[str, Any] = {}
    mr = eng.model_runner
    contexts: list[int] = []

    def graph_round() -> float:
        contexts.append(PROMPT_LEN + len(handles[0]._token_ids) + steps // 2)
        return time_steps(eng, steps)

    def eager_round() -> float:
        saved, mr.decode = mr.decode, None
        try:
            time_steps(eng, 1)  # the switch's first step, untimed
            return time_steps(eng, eager_steps)
        finally:
            mr.decode = saved

    rounds_of = {"eager": eager_round}
    if mr.decode is not None and mr.decode.policy.pick(bs) is not None:
        rounds_of = {"graph": graph_round, **rounds_of}
    time_steps(eng, 5)
    figures = interleaved(rounds_of, rounds)
    graph_t, eager_t = figures.get("graph", []), figures["eager"]
    if graph_t:
        out["graph"] = statistics.median(graph_t)
        out["graph_rounds"] = graph_t
        # where a graph step's time goes: GPU replay (CUDA events) vs the rest (host)
        sub = eng.bus.subscribe("split", types={"step"})
        time_steps(eng, steps)
        evs = [e for e in sub.drain() if e.path == "graph"]
        eng.bus.unsubscribe(sub)
        if evs:
            out["replay_gpu_ms"] = statistics.mean(e.replay_ms for e in evs)
            out["host_ms"] = statistics.mean(e.host_ms for e in evs)
    out["eager"] = statistics.median(eager_t)
    out["eager_rounds"] = eager_t
    if graph_t:  # the same round's contexts: the worst round says whether a graph ever lost
        out["worst_eager_over_graph"] = min(e / g for g, e in zip(graph_t, eager_t))
    out["context"] = statistics.median(contexts) if contexts else PROMPT_LEN + len(handles[0]._token_ids)
    drain(eng, handles)
    return out


def prefill_ms(eng: Engine, n_tokens: int, reps: int) -> dict[str, float]:
    """One prompt of ``n_tokens`` on an idle engine: the step from submit to the first token on the
    host (so the graph figure is the time to first token), breakable graph and eager alternating."""
    g = torch.Generator().manual_seed(n_tokens)
    vocab = eng.spec.vocab_size
    params = SamplingParams(max_new_tokens=1, ignore_eos=True, detokenize=False)
    mr = eng.model_runner
    labels = ["eager"]
    if mr.prefill is not None and mr.prefill.policy.pick(n_tokens) is not None:
        labels.insert(0, "graph")
    times: dict[str, list[float]] = {label: [] for label in labels}
    for i in range(reps + 2):
        for label in labels:
            saved = mr.prefill
            if label == "eager":
                mr.prefill = None
            try:
                eng.submit(torch.randint(10, vocab - 10, (n_tokens,), generator=g).tolist(), params)
                torch.cuda.synchronize()
                t = time.perf_counter()
                eng.step()
                torch.cuda.synchronize()
                if i >= 2:
                    times[label].append((time.perf_counter() - t) * 1e3)
                eng.run_until_idle()
            finally:
                mr.prefill = saved
    return {label: statistics.median(t) for label, t in times.items()}


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


def hf_graph_decode_ms(hf_config: Any, bs: int, steps: int) -> Optional[float]:
    """The stronger peer: transformers' decode step over a StaticCache, captured by hand in one CUDA
    graph (argmax and the feed-back of the token inside it) and replayed, tokens read back every step.
    None (with a logged reason) where this transformers version cannot be captured."""
    from transformers import AutoModelForCausalLM, StaticCache

    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16)
    model.eval()
    g = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(10, hf_config.vocab_size - 10, (bs, PROMPT_LEN), device="cuda", generator=g)
    # StaticCache advances an on-device write counter inside each replay: room for every replay.
    cache = StaticCache(config=hf_config, max_cache_len=PROMPT_LEN + steps + 32)
    try:
        with torch.inference_mode():
            out = model(ids, past_key_values=cache, use_cache=True)
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            pos = torch.full((bs, 1), PROMPT_LEN, dtype=torch.int64, device="cuda")
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm up outside capture (2 steps)
                for _ in range(2):
                    out = model(tok, position_ids=pos, past_key_values=cache, use_cache=True)
                    tok.copy_(out.logits[:, -1].argmax(-1, keepdim=True))
                    pos.add_(1)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = model(tok, position_ids=pos, past_key_values=cache, use_cache=True)
                tok.copy_(out.logits[:, -1].argmax(-1, keepdim=True))
                pos.add_(1)
            for _ in range(3):
                graph.replay()
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(steps):
                graph.replay()
                tok.tolist()  # a serving loop reads tokens back every step
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t) / steps * 1e3
        del graph
    except Exception as exc:  # a transformers version whose step cannot be captured: say so, go on
        log(f"transformers in a CUDA graph, bs {bs}: not captured ({type(exc).__name__}: {str(exc)[:160]})")
        ms = None
    del model, cache
    torch.cuda.empty_cache()
    return ms


def capture_stats(bus_sub: Any) -> dict[str, Any]:
    stats: dict[str, Any] = {}
    for e in bus_sub.drain():
        if e.type == "capture_finished":
            stats[e.phase] = {
                "seconds": e.seconds,
                "memory_bytes": e.memory_bytes,
                "buckets": len(e.captured),
                "failed": list(e.failed),
            }
    return stats


def bench_shape(shape: str, args: argparse.Namespace, bw: float, attentions: list[str]) -> dict[str, Any]:
    overrides = {"num_hidden_layers": args.layers} if args.layers else {}
    ckpt = random_ckpt(shape, **overrides)
    hf_config = ckpt.hf_config
    res: dict[str, Any] = {
        "shape": shape,
        "weights_bytes": ckpt.weights_bytes,
        "decode": {},
        "prefill": {},
        "capture": {},
    }
    for attn in attentions:
        bus = EventBus()
        sub = bus.subscribe("bench", types={"capture_finished"})
        t = time.perf_counter()
        context = decode_run_context(args.steps, args.eager_steps, args.rounds)
        eng = make_engine(ckpt, attn, graphs=True, bus=bus, longest_context=context)
        log(f"[{shape}/{attn}] engine ready in {time.perf_counter() - t:.1f} s")
        res["capture"][attn] = capture_stats(sub)
        bus.unsubscribe(sub)
        log(f"[{shape}/{attn}] capture {res['capture'][attn]}")
        for bs in args.bs:
            d = decode_ms(eng, bs, args.steps, args.eager_steps, args.rounds)
            d["floor_ms"] = floor_ms(ckpt.model, [int(d["context"])] * bs, bw)
            res["decode"].setdefault(attn, {})[bs] = d
            log(f"[{shape}/{attn}] decode bs {bs}: {d}")
        for n in args.prefill:
            p = prefill_ms(eng, n, args.prefill_reps)
            res["prefill"].setdefault(attn, {})[n] = p
            log(f"[{shape}/{attn}] prefill {n}: {p}")
        if attn == attentions[0] and args.events:
            res["events"] = events_overhead(eng, 1, args.steps, 5, torch.cuda.synchronize)
            log(f"[{shape}/{attn}] events overhead {res['events']}")
        eng.close()  # graphs and pool released now, before the next engine captures
        del eng
        release_cuda()
    del ckpt
    release_cuda()
    res["transformers"], res["transformers_graph"] = {}, {}
    for bs in args.hf_bs:
        res["transformers"][bs] = hf_decode_ms(hf_config, bs, args.hf_steps)
        log(f"[{shape}] transformers decode bs {bs}: {res['transformers'][bs]:.3f} ms")
    for bs in args.hf_graph_bs:
        res["transformers_graph"][bs] = hf_graph_decode_ms(hf_config, bs, max(args.steps, 20))
        log(f"[{shape}] transformers decode in a CUDA graph, bs {bs}: {res['transformers_graph'][bs]} ms")
    return res


def table(results: list[dict[str, Any]]) -> str:
    decode = []
    for r in results:
        for attn, by_bs in r["decode"].items():
            for bs, d in by_bs.items():
                g, e, floor = d.get("graph"), d.get("eager"), d["floor_ms"]
                hf, hfg = r["transformers"].get(bs), r["transformers_graph"].get(bs)
                decode.append(
                    [
                        r["shape"],
                        attn,
                        bs,
                        int(d["context"]),
                        fmt(g),
                        fmt(e),
                        ratio(e, g),
                        ratio(d.get("worst_eager_over_graph"), 1.0),
                        f"{floor:.3f}",
                        ratio(g, floor),
                        fmt(hf),
                        fmt(hfg),
                        ratio(hfg, g),
                    ]
                )
    prefill = [
        [r["shape"], attn, n, fmt(p.get("graph")), fmt(p.get("eager")), ratio(p.get("eager"), p.get("graph"))]
        for r in results
        for attn, by_n in r["prefill"].items()
        for n, p in by_n.items()
    ]
    capture = [
        [r["shape"], attn, phase, c["buckets"], f"{c['seconds']:.2f}", f"{c['memory_bytes'] / 2**20:.0f}"]
        for r in results
        for attn, phases in r["capture"].items()
        for phase, c in phases.items()
    ]
    parts = [
        md_table(
            [
                "shape",
                "attention",
                "bs",
                "context",
                "graph ms",
                "eager ms",
                "eager/graph",
                "worst round",
                "HBM floor ms",
                "graph/floor",
                "transformers ms",
                "transformers in a CUDA graph ms",
                "transformers-graph/graph",
            ],
            decode,
        ),
        md_table(
            [
                "shape",
                "attention",
                "prefill tokens",
                "breakable ms (= TTFT, idle engine)",
                "eager ms",
                "eager/breakable",
            ],
            prefill,
        ),
        md_table(["shape", "attention", "phase", "buckets", "capture s", "graph memory MiB"], capture),
    ]
    for r in results:
        if "events" in r:
            ev = r["events"]
            parts.append(
                f"events on/off at bs 1 ({r['shape']}): {ev['on_ms']:.4f} / {ev['off_ms']:.4f} ms = {ev['ratio']:.4f}"
            )
    return "\n\n".join(parts)


def build(device: str, shape: str, bs: int) -> Any:
    if device == "cpu":
        from graphtop.engine.config import EngineConfig
        from graphtop.engine.engine import Engine
        from graphtop.engine.telemetry.bus import EventBus

        return Engine.from_pretrained(
            None, config=EngineConfig(device="cpu", capture_before_serving=True), bus=EventBus()
        )
    return make_engine(random_ckpt(shape), max_running=max(8, bs))


def events_only(args: argparse.Namespace) -> None:
    """``--events-only``: the event stream's cost alone, per shape (the demo model on the CPU) and batch size."""
    for shape in args.shapes.split(",")[:1] if args.device == "cpu" else args.shapes.split(","):
        for bs in args.bs:
            engine = build(args.device, shape, bs)
            try:
                r = events_overhead(engine, bs, args.steps, args.rounds, sync_for(args.device))
                log(
                    f"events on/off, {args.device}, bs {bs}, decode graph path "
                    f"({engine.model_runner.decode_backend_label}): {r['on_ms']:.4f} / {r['off_ms']:.4f} ms "
                    f"= {r['ratio']:.4f}"
                )
            finally:
                engine.close()


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "bench-out"), help="folder for bench.json and bench.md")
    ap.add_argument("--shapes", default="qwen3-0.6b,llama-3.1-8b")
    ap.add_argument("--attention", default="flashinfer,torch")
    ap.add_argument("--bs", default="1,8,64,256")
    ap.add_argument("--prefill", default="64,128,256,512,1024")
    ap.add_argument("--hf-bs", default="1,64")
    ap.add_argument("--hf-graph-bs", default="1,64", help="transformers' step in a hand-captured CUDA graph")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved graph/eager rounds per batch size")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--eager-steps", type=int, default=10)
    ap.add_argument("--hf-steps", type=int, default=10)
    ap.add_argument("--prefill-reps", type=int, default=5)
    ap.add_argument("--layers", type=int, default=0, help="override layer count (quick runs)")
    ap.add_argument("--no-events", dest="events", action="store_false")
    ap.add_argument("--events-only", action="store_true", help="only the event stream's cost (--device cpu: demo)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="--events-only")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.events_only:
        what = f"{args.steps} steps after a {EVENTS_PROMPT}-token prompt"
        refuse_past_context(ap, EVENTS_PROMPT + args.steps + 2, what)
        if args.device == "cuda" and not torch.cuda.is_available():
            ap.error("--device cuda needs a CUDA device (--device cpu runs on the demo model)")
        args.bs = comma_ints(args.bs)
        events_only(args)
        return 0
    refuse_past_context(
        ap,
        decode_run_context(args.steps, args.eager_steps, args.rounds),
        f"{args.rounds} rounds of {args.steps} graph and {args.eager_steps} eager steps",
    )
    args.bs, args.prefill = comma_ints(args.bs), comma_ints(args.prefill)
    args.hf_bs, args.hf_graph_bs = comma_ints(args.hf_bs), comma_ints(args.hf_graph_bs)
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
    log(f"device {torch.cuda.get_device_name(dev)}; copy bandwidth {bw / 1e12:.2f} TB/s (2 GiB copy, read + write)")
    results = []
    for shape in [s for s in args.shapes.split(",") if s]:
        results.append(bench_shape(shape, args, bw, attentions))
        write_json(
            args.out,
            "bench.json",
            {"device": torch.cuda.get_device_name(dev), "copy_bandwidth": bw, "results": results},
        )
    md = table(results)
    write_text(args.out, "bench.md", md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
