"""Can a 256-row decode layer hide its projections behind its attention? The layer's kernels alone (the
four cuBLAS projections, SiLU·mul and the paged decode attention over cached K/V; no norms or RoPE),
over L layers with weights and a K/V cache each, in one CUDA graph, scheduled four ways:

- ``seq``: the whole batch, one kernel after another (what a step does today);
- ``seq2``: two half-batches one after the other (the cost of splitting alone);
- ``streams``: two half-batches pipelined on two plain streams, one half's attention beside the other
  half's o, gate|up, down and next q|k|v (both kernels compete for every SM);
- ``green:N``: the same pipeline with the attention on a green context of N SMs and the projections on
  the rest (CUDA green contexts: disjoint SM partitions, so neither kernel's blocks wait behind the
  other's).

    python bench/overlap_probe.py [--shapes qwen3-0.6b,llama-3.1-8b] [--bs 256] [--ctx 200]
        [--green 64,80,96] [--attn fa2|triton]
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from decode_attn_bench import graph_us  # noqa: E402
from graph_bench import copy_bandwidth  # noqa: E402

D = 128
DT = torch.bfloat16
WEIGHT_BUDGET = 8 << 30
KV_BUDGET = 8 << 30


@dataclass(frozen=True)
class Shape:
    hidden: int
    heads: int
    kv_heads: int
    inter: int
    layers: int


SHAPES = {
    "qwen3-0.6b": Shape(1024, 16, 8, 3072, 28),
    "llama-3.1-8b": Shape(4096, 32, 8, 14336, 32),
}


def log(*a: Any) -> None:
    print(*a, flush=True)


class Half:
    """One slice of the batch's rows: its activations and its attention plan."""

    def __init__(self, shape: Shape, rows: int, ctx: int, first_slot: int, attn: str, pool_slots: int):
        self.rows = rows
        dev = "cuda"
        qkv_w = (shape.heads + 2 * shape.kv_heads) * D
        self.x = torch.randn(rows, shape.hidden, device=dev, dtype=DT)
        self.qkv = torch.empty(rows, qkv_w, device=dev, dtype=DT)
        self.q = torch.randn(rows, shape.heads, D, device=dev, dtype=DT)
        self.attn_out = torch.randn(rows, shape.heads * D, device=dev, dtype=DT)
        self.h = torch.empty(rows, shape.hidden, device=dev, dtype=DT)
        self.gu = torch.empty(rows, 2 * shape.inter, device=dev, dtype=DT)
        self.act = torch.empty(rows, shape.inter, device=dev, dtype=DT)
        gen = torch.Generator().manual_seed(first_slot)
        slots = (torch.randperm(pool_slots - 1, generator=gen)[: rows * ctx] + 1).to(torch.int32)
        self.indptr_h = torch.arange(0, rows * ctx + 1, ctx, dtype=torch.int32)
        self.indices_h = slots
        self.last_h = torch.ones(rows, dtype=torch.int32)
        self.indptr, self.indices, self.last = self.indptr_h.cuda(), self.indices_h.cuda(), self.last_h.cuda()
        self.attn_kind = attn
        self.shape = shape
        if attn == "fa2":
            import flashinfer

            from graphtop.engine.attention.flashinfer_backend import CUDA_CORE_DECODE_GROUPS

            self.ws = torch.zeros(256 << 20, dtype=torch.uint8, device=dev)
            group = shape.heads // shape.kv_heads
            self.wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self.ws, "NHD", use_cuda_graph=True, use_tensor_cores=group not in CUDA_CORE_DECODE_GROUPS,
                paged_kv_indptr_buffer=self.indptr, paged_kv_indices_buffer=self.indices,
                paged_kv_last_page_len_buffer=self.last, backend="fa2",
            )
            self.wrapper.plan(self.indptr_h, self.indices_h, self.last_h, shape.heads, shape.kv_heads, D, 1,
                              pos_encoding_mode="NONE", q_data_type=DT, kv_data_type=DT, sm_scale=D**-0.5)
        else:
            from graphtop.models.kernels.decode_attention import PagedDecode

            self.kern = PagedDecode(shape.heads, shape.kv_heads, D, 1, D**-0.5, rows, torch.device(dev))

    def attention(self, kc: torch.Tensor, vc: torch.Tensor) -> None:
        if self.attn_kind == "fa2":
            self.wrapper.run(self.q, (kc, vc), out=self.attn_out.view(self.rows, -1, D))
        else:
            self.kern.run(self.q, kc, vc, self.indptr, self.indices, self.last,
                          out=self.attn_out.view(self.rows, -1, D))


class Layers:
    """Weights and a page-size-1 K/V cache per layer."""

    def __init__(self, shape: Shape, bs: int, ctx: int):
        s = shape
        per_layer_w = ((s.heads + 2 * s.kv_heads) * D * s.hidden + s.hidden * s.heads * D + 3 * s.inter * s.hidden) * 2
        self.slots = bs * ctx + 1
        per_layer_kv = 2 * self.slots * s.kv_heads * D * 2
        self.n = max(2, min(s.layers, WEIGHT_BUDGET // per_layer_w, KV_BUDGET // per_layer_kv))
        dev = "cuda"
        mk = lambda *shp: torch.randn(*shp, device=dev, dtype=DT) * 0.02  # noqa: E731
        self.wqkv = [mk((s.heads + 2 * s.kv_heads) * D, s.hidden) for _ in range(self.n)]
        self.wo = [mk(s.hidden, s.heads * D) for _ in range(self.n)]
        self.wgu = [mk(2 * s.inter, s.hidden) for _ in range(self.n)]
        self.wd = [mk(s.hidden, s.inter) for _ in range(self.n)]
        self.kc = [torch.randn(self.slots, 1, s.kv_heads, D, device=dev, dtype=DT) for _ in range(self.n)]
        self.vc = [torch.randn(self.slots, 1, s.kv_heads, D, device=dev, dtype=DT) for _ in range(self.n)]
        self.weight_bytes = per_layer_w
        self.kv_bytes_per_layer = 2 * bs * ctx * s.kv_heads * D * 2


def qkv(lay: Layers, i: int, h: Half) -> None:
    torch.mm(h.x, lay.wqkv[i].t(), out=h.qkv)


def attn(lay: Layers, i: int, h: Half) -> None:
    h.attention(lay.kc[i], lay.vc[i])


def rest(lay: Layers, i: int, h: Half) -> None:
    """o, gate|up, SiLU·mul, down: what follows the attention in a layer."""
    torch.mm(h.attn_out, lay.wo[i].t(), out=h.h)
    torch.mm(h.h, lay.wgu[i].t(), out=h.gu)
    g, u = h.gu.chunk(2, dim=-1)
    torch.mul(F.silu(g), u, out=h.act)
    torch.mm(h.act, lay.wd[i].t(), out=h.x)


def sequential(lay: Layers, parts: list[Half]) -> Callable[[], None]:
    def run() -> None:
        for i in range(lay.n):
            for h in parts:
                qkv(lay, i, h)
                attn(lay, i, h)
                rest(lay, i, h)

    return run


def pipelined(lay: Layers, a: Half, b: Half, s_attn: torch.cuda.Stream, s_gemm: torch.cuda.Stream) -> Callable[[], None]:
    """One half's attention on ``s_attn`` beside the other half's projections on ``s_gemm``."""

    def handoff(src: torch.cuda.Stream, dst: torch.cuda.Stream) -> None:
        ev = torch.cuda.Event()
        ev.record(src)
        dst.wait_event(ev)

    def run() -> None:
        cur = torch.cuda.current_stream()
        s_attn.wait_stream(cur)
        s_gemm.wait_stream(cur)
        done: dict[int, torch.cuda.Event] = {}  # each half's latest attention, recorded right after it

        def attend(i: int, h: Half) -> None:
            handoff(s_gemm, s_attn)  # its q|k|v, just issued on s_gemm
            with torch.cuda.stream(s_attn):
                attn(lay, i, h)
            done[id(h)] = torch.cuda.Event()
            done[id(h)].record(s_attn)

        for h in (a, b):
            with torch.cuda.stream(s_gemm):
                qkv(lay, 0, h)
            attend(0, h)
        for i in range(lay.n):
            for h in (a, b):
                s_gemm.wait_event(done[id(h)])  # this half's attention only, not the other half's queued after it
                with torch.cuda.stream(s_gemm):
                    rest(lay, i, h)
                    if i + 1 < lay.n:
                        qkv(lay, i + 1, h)
                if i + 1 < lay.n:
                    attend(i + 1, h)
        cur.wait_stream(s_attn)
        cur.wait_stream(s_gemm)

    run.streams = (s_attn, s_gemm)  # type: ignore[attr-defined]
    return run


def on(stream: torch.cuda.Stream, fn: Callable[[], Any]) -> Callable[[], None]:
    """``fn`` issued on ``stream`` (joined back to the caller's stream)."""

    def run() -> None:
        cur = torch.cuda.current_stream()
        stream.wait_stream(cur)
        with torch.cuda.stream(stream):
            fn()
        cur.wait_stream(stream)

    return run


def graph_ms(fn: Callable[[], None]) -> float:
    """ms of one replay of a graph that runs ``fn`` once (decode_attn_bench's timing, one "layer")."""
    return graph_us(SimpleNamespace(layers=1), lambda _layer: fn()) / 1e3


def eager_ms(fn: Callable[[], None], reps: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(reps):
        fn()
    t1.record()
    t1.synchronize()
    return t0.elapsed_time(t1) / reps


def green_streams(n_attn: int) -> tuple[torch.cuda.Stream, torch.cuda.Stream, str]:
    """Disjoint partitions: ``n_attn`` SMs for the attention, the rest for the projections."""
    try:
        from flashinfer.green_ctx import split_device_green_ctx_by_sm_count

        streams, res = split_device_green_ctx_by_sm_count(torch.device("cuda:0"), [n_attn])
        return streams[0], streams[1], f"flashinfer {res[0].sm.smCount}+{res[1].sm.smCount}"
    except Exception as exc:  # no cuda-python: torch's green contexts (partitions may overlap)
        from torch.cuda.green_contexts import GreenContext

        sms = torch.cuda.get_device_properties(0).multi_processor_count
        ga, gb = GreenContext.create(num_sms=n_attn), GreenContext.create(num_sms=sms - n_attn)
        green_streams.keep.extend([ga, gb])  # type: ignore[attr-defined]
        return ga.Stream(), gb.Stream(), f"torch {n_attn}+{sms - n_attn} ({type(exc).__name__}: {str(exc)[:80]})"


green_streams.keep = []  # type: ignore[attr-defined]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="qwen3-0.6b,llama-3.1-8b")
    ap.add_argument("--bs", default="256")
    ap.add_argument("--ctx", type=int, default=200)
    ap.add_argument("--green", default="64,80,96")
    ap.add_argument("--attn", default="fa2,triton")
    args = ap.parse_args()
    bw = copy_bandwidth(torch.device("cuda"))
    log(f"copy bandwidth {bw / 1e12:.2f} TB/s; SMs {torch.cuda.get_device_properties(0).multi_processor_count}")
    log("| shape | bs | attn | schedule | ms (L layers, graph) | µs a layer | ÷ seq | K/V bytes' µs a layer | eager ms |")
    log("|---|---|---|---|---|---|---|---|---|")
    for name in args.shapes.split(","):
        shape = SHAPES[name]
        for bs in map(int, args.bs.split(",")):
            lay = Layers(shape, bs, args.ctx)
            kv_us = lay.kv_bytes_per_layer / bw * 1e6
            for kind in args.attn.split(","):
                try:
                    whole = Half(shape, bs, args.ctx, 1, kind, lay.slots)
                    a = Half(shape, bs // 2, args.ctx, 2, kind, lay.slots)
                    b = Half(shape, bs - bs // 2, args.ctx, 3, kind, lay.slots)
                except Exception as exc:
                    log(f"| {name} | {bs} | {kind} | setup failed: {type(exc).__name__}: {str(exc)[:200]} |")
                    continue
                cases: list[tuple[str, Callable[[], None]]] = [
                    ("seq", sequential(lay, [whole])),
                    ("seq2", sequential(lay, [a, b])),
                    ("streams", pipelined(lay, a, b, torch.cuda.Stream(), torch.cuda.Stream())),
                ]
                for n in map(int, filter(None, args.green.split(","))):
                    try:
                        sa, sg, how = green_streams(n)
                        cases.append((f"green:{n} [{how}]", pipelined(lay, a, b, sa, sg)))
                    except Exception as exc:
                        log(f"| {name} | {bs} | {kind} | green:{n} failed: {type(exc).__name__}: {str(exc)[:200]} |")
                alone: list[tuple[str, Callable[[], None]]] = []
                for label, fn in list(cases[3:]):
                    n = label.split()[0]
                    sa, sg = fn.streams  # type: ignore[attr-defined]
                    alone.append((f"attn half alone on {n}", on(sa, lambda: [attn(lay, i, a) for i in range(lay.n)])))
                    alone.append((f"rest+qkv half alone beside {n}",
                                  on(sg, lambda: [(rest(lay, i, a), qkv(lay, i, a)) for i in range(lay.n)])))
                base = None
                for label, fn in cases:
                    try:
                        ms = graph_ms(fn)
                        em = eager_ms(fn)
                    except Exception as exc:
                        log(f"| {name} | {bs} | {kind} | {label} | failed: {type(exc).__name__}: {str(exc)[:300]} |")
                        torch.cuda.synchronize()
                        continue
                    base = ms if base is None else base
                    log(f"| {name} | {bs} | {kind} | {label} | {ms:.3f} ({lay.n}) | {ms / lay.n * 1e3:.1f} | "
                        f"{ms / base:.3f} | {kv_us:.1f} | {em:.3f} |")
                # the parts alone, for the partition's arithmetic
                alone = [("attn half alone", lambda: [attn(lay, i, a) for i in range(lay.n)]),
                         ("rest+qkv half alone", lambda: [(rest(lay, i, a), qkv(lay, i, a)) for i in range(lay.n)])] + alone
                for label, fn in alone:
                    try:
                        ms = graph_ms(fn)
                    except Exception as exc:
                        log(f"| {name} | {bs} | {kind} | {label} | failed: {type(exc).__name__}: {str(exc)[:300]} |")
                        continue
                    log(f"| {name} | {bs} | {kind} | {label} | {ms:.3f} ({lay.n}) | {ms / lay.n * 1e3:.1f} | | | |")
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
