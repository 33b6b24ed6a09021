"""Decode attention per layer, as a decode graph runs it: FlashInfer's pipeline (q/k-norm+RoPE, K/V
store, FlashInfer decode, its merge: four launches) against the one-launch Triton kernel
(models/kernels/decode_attention.py), each captured as L layers in one CUDA graph and timed by replay,
so launch gaps count. Every layer has its own KV cache, so the caches are not all sitting in L2.

    python3 bench/decode_attn_bench.py [--shapes qwen3-0.6b,llama-3.1-8b] [--bs 1,8,64,256]
        [--ctx 220,1000,4000] [--layouts shuffled,contiguous,engine] [--q-entry] [--sweep] [--sweep-bs 1,8]
        [--sweep-ctx 220,1000] [--out DIR]

--layouts times the table's cases on caches whose slots are shuffled (each token anywhere), contiguous,
or laid out as a fresh engine's pool hands them out (``slot_order``); the last column is the time the
case's K/V bytes take at the device-to-device copy bandwidth measured at the start. --q-entry adds the
shipped launch from q over cached K/V (``PagedDecode.run``: no q/k-norm, RoPE or K/V store); with a
ladder of contexts (--ctx 2,64,128,...) the table places a launch's fixed cost against its per-token one.

--sweep also tries a grid of launch shapes (DecodeTuning) at the --sweep-bs batch sizes and prints the
best; batches of 64 rows and more get a grid of tile, warps and pipeline depth (no splits: rows x KV
heads fill the SMs). --sweep-splits gives those batches a grid of context splits instead (small split
chunks, two or four programs a (row, KV head)), with the shipped large-batch launch as the reference.
--sweep-deep tries, at every batch size, deeper pipelines (five to eight stages: Triton keeps two or more
tiles in flight only from five on, the page-list load each K/V load depends on taking stages), with the
shipped launch of that size as the reference. --sweep-regs tries launches with a register cap
(``DecodeTuning.maxnreg``) around the shipped one of each size.

    python3 bench/decode_attn_bench.py --ncu 64:220:engine,64:220:shuffled --shapes llama-3.1-8b

--ncu runs nothing else: one launch per case (rows:context:slot layout, the first shape), the shipped launch
shape of that many rows, in the order given, each inside an NVTX range named ``ncu`` for Nsight Compute
(``ncu --nvtx --nvtx-include "ncu/" ...``; scripts/ncu_check.sh runs the usual reports): timing says how
long a launch takes, the hardware counters whether it waits on DRAM, on latency or on its issue slots.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from typing import Any, Callable

import torch
from harness import PROMPT_LEN, attention_heads, copy_bandwidth, graph_us, log, write_json

from graphtop.engine.attention.decode_policy import CUDA_CORE_DECODE_GROUPS
from graphtop.models.kernels import fused as tk
from graphtop.models.kernels.decode_attention import PagedDecode
from graphtop.models.kernels.decode_attention_tuning import DecodeTuning
from graphtop.models.kernels.qkv_input import QKVInput

SHAPES = {name: attention_heads(name) for name in ("qwen3-0.6b", "llama-3.1-8b")}  # head_dim 128 both
D = 128
DT = torch.bfloat16
KV_BUDGET = 6 << 30  # bytes of KV cache across the graph's layers


LAYOUTS = ("shuffled", "contiguous", "engine")


def slot_order(layout: str, bs: int, ctx: int, seed: int = 0) -> torch.Tensor:
    """The cache slots of every row's context, [bs, ctx] (slot 0 is never used). ``shuffled``: each token
    anywhere (the worst case for DRAM locality); ``contiguous``: each row's context in consecutive slots;
    ``engine``: what a fresh engine's pool hands out with page size 1: each row's prompt (the benchmarks'
    ``PROMPT_LEN`` tokens) consecutive, then one slot a row per decode step, so a row's later tokens lie
    ``bs`` slots apart."""
    n = bs * ctx
    if layout == "shuffled":
        return (torch.randperm(n, generator=torch.Generator().manual_seed(seed)) + 1).view(bs, ctx).to(torch.int32)
    if layout == "contiguous":
        return (torch.arange(n) + 1).view(bs, ctx).to(torch.int32)
    if layout == "engine":
        p = min(ctx, PROMPT_LEN)
        prompt = torch.arange(bs * p).view(bs, p)
        steps = bs * p + torch.arange(bs * (ctx - p)).view(ctx - p, bs).t()
        return (torch.cat([prompt, steps], dim=1) + 1).to(torch.int32)
    raise ValueError(f"unknown slot layout {layout!r} (one of {', '.join(LAYOUTS)})")


class Case:
    """One batch: per-layer caches, the page lists (page size 1, slots laid out by ``layout``), q|k|v
    rows, positions."""

    def __init__(
        self, heads: tuple[int, int, bool], bs: int, ctx: int, seed: int = 0, layout: str = "shuffled"
    ) -> None:
        hq, hkv, norm = heads
        self.hq, self.hkv, self.bs, self.ctx = hq, hkv, bs, ctx
        slots = bs * ctx + 1
        per_layer = 2 * slots * hkv * D * 2
        self.layers = max(2, min(16, KV_BUDGET // per_layer))
        g = torch.Generator(device="cuda").manual_seed(seed)
        self.kc = [torch.randn(slots, 1, hkv, D, device="cuda", dtype=DT, generator=g) for _ in range(self.layers)]
        self.vc = [torch.randn(slots, 1, hkv, D, device="cuda", dtype=DT, generator=g) for _ in range(self.layers)]
        self.indices = slot_order(layout, bs, ctx, seed).reshape(-1).cuda()
        self.indptr_h = torch.arange(0, bs * ctx + 1, ctx, dtype=torch.int32)
        self.indptr = self.indptr_h.cuda()
        self.last_h = torch.ones(bs, dtype=torch.int32)
        self.last = self.last_h.cuda()
        self.loc = self.indices.view(bs, ctx)[:, -1].to(torch.int64)
        self.qkv = torch.randn(bs, (hq + 2 * hkv) * D, device="cuda", dtype=DT, generator=g)
        self.pos = torch.full((bs,), ctx - 1, dtype=torch.int64, device="cuda")
        self.cs = torch.randn(8192, D, device="cuda")
        self.qw = torch.rand(D, device="cuda", dtype=DT, generator=g) + 0.5 if norm else None
        self.kw = torch.rand(D, device="cuda", dtype=DT, generator=g) + 0.5 if norm else None


def layer_us(case: Case, layer_fn: Callable[[int], Any], reps: int = 20) -> float:
    """Per-layer µs of a graph that runs ``layer_fn`` for every layer of the case (best of 3 x ``reps``
    replays)."""
    return graph_us(layer_fn, case.layers, replays=reps, samples=3, best=True)


def flashinfer_layer(case: Case) -> Callable[[int], Any]:
    import flashinfer

    hq, hkv = case.hq, case.hkv
    ws = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        ws,
        "NHD",
        use_cuda_graph=True,
        use_tensor_cores=(hq // hkv) not in CUDA_CORE_DECODE_GROUPS,
        paged_kv_indptr_buffer=case.indptr.clone(),
        paged_kv_indices_buffer=case.indices.clone(),
        paged_kv_last_page_len_buffer=case.last.clone(),
        backend="fa2",
    )
    w.plan(
        case.indptr_h,
        case.indices,
        case.last_h,
        hq,
        hkv,
        D,
        1,
        pos_encoding_mode="NONE",
        q_data_type=DT,
        kv_data_type=DT,
        sm_scale=D**-0.5,
    )
    q_size, kv_size = hq * D, hkv * D

    def layer(i: int) -> Any:
        q, k, v = case.qkv.split([q_size, kv_size, kv_size], dim=-1)
        q, k, v = q.view(-1, hq, D), k.view(-1, hkv, D), v.view(-1, hkv, D)
        q = tk.qk_norm_rope(case.pos, q, k, case.cs, case.qw, case.kw, 1e-6)
        kf, vf = case.kc[i].view(-1, hkv, D), case.vc[i].view(-1, hkv, D)
        tk.store_kv(k, v, kf, vf, case.loc)
        return w.run(q, (case.kc[i], case.vc[i]))

    layer.keep = (ws, w)  # type: ignore[attr-defined]
    return layer


def paged_decode(case: Case, tuning: DecodeTuning | None = None, pdl: bool | None = None) -> PagedDecode:
    """The Triton decode kernel for the case's heads and rows (page size 1), the engine's launch shapes
    unless ``tuning`` is given."""
    return PagedDecode(case.hq, case.hkv, D, 1, D**-0.5, case.bs, torch.device("cuda"), tuning, pdl)


def triton_layer(case: Case, tuning: DecodeTuning | None = None, pdl: bool | None = None) -> Callable[[int], Any]:
    kern = paged_decode(case, tuning, pdl)

    def layer(i: int) -> Any:
        return kern.run_qkv(
            QKVInput(case.qkv, case.pos, case.cs, case.qw, case.kw, 1e-6),
            case.kc[i],
            case.vc[i],
            case.indptr,
            case.indices,
            case.last,
        )

    return layer


def triton_q_layer(case: Case) -> Callable[[int], Any]:
    """The shipped launch from q over cached K/V (``PagedDecode.run``): no q/k-norm, RoPE or K/V store,
    and the first tile loaded after the PDL wait, so its difference from ``triton_layer`` is what those
    links of the chain cost."""
    kern = paged_decode(case)
    q = case.qkv[:, : case.hq * D].view(case.bs, case.hq, D)

    def layer(i: int) -> Any:
        return kern.run(q, case.kc[i], case.vc[i], case.indptr, case.indices, case.last)

    return layer


def shipped_tuning(case: Case) -> DecodeTuning:
    """The launch shape the engine gives the case's rows and heads: every sweep's reference."""
    return paged_decode(case).tuning_for(case.bs)


def deep_grid(case: Case) -> list[DecodeTuning]:
    """The shipped launch of the case's rows, then deeper pipelines with its split chunk."""
    shipped = shipped_tuning(case)
    mc = shipped.min_chunk
    return [shipped] + [
        DecodeTuning(bt, mc, nw, ns)
        for bt, nw, ns in (
            (16, 2, 5),
            (16, 2, 6),
            (16, 2, 8),
            (32, 2, 5),
            (32, 2, 6),
            (32, 2, 7),
            (64, 2, 5),
            (64, 4, 5),
            (128, 4, 5),
        )
    ]


def splits_grid(case: Case) -> list[DecodeTuning]:
    """The shipped launch of the case's rows, then small split chunks over more programs: waves 8 / 16 give
    two / four programs a (row, KV head) at 64 rows on 132 SMs."""
    return [shipped_tuning(case)] + [
        DecodeTuning(bt, mc, 2, ns, 2, waves)
        for bt, mc in ((32, 32), (32, 64), (64, 64), (64, 128))
        for waves in (8, 16)
        for ns in (2, 3)
    ]


def regs_grid(case: Case) -> list[DecodeTuning]:
    """The shipped launch of the case's rows, then launches with a register cap (``maxnreg``): more warps a
    program, or more programs an SM, where registers (the first K/V tile held across the PDL wait) and
    not shared memory limit how many fit."""
    shipped = shipped_tuning(case)
    mc, bs = shipped.min_chunk, case.bs
    if bs >= 256:
        shapes = ((16, 2, 6, 128), (16, 2, 6, 96), (16, 4, 6, 128), (32, 2, 3, 128), (32, 4, 3, 128), (32, 4, 4, 128))
    elif bs >= 64:
        shapes = ((64, 4, 3, 128), (64, 4, 2, 128), (32, 4, 3, 0), (32, 4, 4, 128), (32, 2, 3, 128), (64, 4, 3, 0))
    else:
        shapes = ((128, 8, 2, 128), (64, 4, 2, 128), (64, 4, 3, 128), (128, 4, 2, 168))
    return [shipped] + [
        DecodeTuning(bt, mc, nw, ns, shipped.prefetch, shipped.waves, reg) for bt, nw, ns, reg in shapes
    ]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="qwen3-0.6b,llama-3.1-8b")
    ap.add_argument("--bs", default="1,8,64,256")
    ap.add_argument("--ctx", default="220,1000,4000")
    ap.add_argument(
        "--layouts", default="shuffled", help=f"slot layouts of the table's caches, comma list of {', '.join(LAYOUTS)}"
    )
    ap.add_argument(
        "--q-entry",
        action="store_true",
        help="also time the shipped launch from q over cached K/V (no norm, RoPE or K/V store)",
    )
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--sweep-bs", default="1,8")
    ap.add_argument("--sweep-ctx", default="220,1000")
    grids = ap.add_mutually_exclusive_group()
    grids.add_argument("--sweep-splits", action="store_true", help="from 64 rows on, sweep context splits")
    grids.add_argument("--sweep-deep", action="store_true", help="sweep pipelines of five to eight stages")
    grids.add_argument("--sweep-regs", action="store_true", help="sweep launches with a register cap")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--ncu", metavar="CASES", help="rows:context:layout,...: only these launches, in the range ncu")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device")
    if args.ncu:
        ncu_launches(args.shapes.split(",")[0], args.ncu)
        return 0
    rows = []
    log(
        "| shape | bs | context | slots | FlashInfer pipeline µs/layer | Triton one-launch µs/layer "
        "| FlashInfer ÷ Triton | Triton without PDL | K/V bytes µs at the copy bandwidth |"
        + (" Triton from q µs/layer |" if args.q_entry else "")
    )
    log("|---|---|---|---|---|---|---|---|---|" + ("---|" if args.q_entry else ""))
    bw = copy_bandwidth(torch.device("cuda"))
    for shape in args.shapes.split(","):
        for bs, ctx, layout in itertools.product(
            map(int, args.bs.split(",")), map(int, args.ctx.split(",")), args.layouts.split(",")
        ):
            if bs * ctx > 256 * 1000:
                continue
            case = Case(SHAPES[shape], bs, ctx, layout=layout)
            fi = layer_us(case, flashinfer_layer(case))
            tr = layer_us(case, triton_layer(case))
            tr0 = layer_us(case, triton_layer(case, pdl=False))
            kv_us = 2 * bs * ctx * case.hkv * D * 2 / bw * 1e6
            row = dict(
                shape=shape,
                bs=bs,
                ctx=ctx,
                layout=layout,
                flashinfer_us=fi,
                triton_us=tr,
                triton_no_pdl_us=tr0,
                kv_bytes_us=kv_us,
                copy_bw=bw,
            )
            line = (
                f"| {shape} | {bs} | {ctx} | {layout} | {fi:.2f} | {tr:.2f} | {fi / tr:.2f}× | {tr0:.2f} "
                f"| {kv_us:.2f} |"
            )
            if args.q_entry:
                row["triton_q_us"] = layer_us(case, triton_q_layer(case))
                line += f" {row['triton_q_us']:.2f} |"
            rows.append(row)
            log(line)
            del case
            torch.cuda.empty_cache()
    if args.sweep:
        small = [
            DecodeTuning(bt, mc, nw, 2) for bt in (32, 64, 128) for mc in (128, 256, 512) for nw in (2, 4) if mc >= bt
        ]
        # from 64 rows on, rows x KV heads fill the SMs and splitting the context never won
        # (docs/benchmarks.md, tried and not shipped):
        # only the tile's shape
        large = [
            DecodeTuning(bt, 256, nw, ns)
            for bt in (16, 32, 64, 128)
            for nw in (2, 4, 8)
            for ns in (2, 3, 4)
            if bt * ns <= 256
        ]
        for shape in args.shapes.split(","):
            for bs, ctx in itertools.product(map(int, args.sweep_bs.split(",")), map(int, args.sweep_ctx.split(","))):
                case = Case(SHAPES[shape], bs, ctx)
                res = []
                grid = small if bs < 64 else large
                if args.sweep_deep:
                    grid = deep_grid(case)
                elif args.sweep_regs:
                    grid = regs_grid(case)
                elif args.sweep_splits and bs >= 64:
                    grid = splits_grid(case)
                for t in grid:
                    try:
                        res.append((layer_us(case, triton_layer(case, t), reps=10), t))
                    except Exception as exc:  # a shape the compiler refuses: report, go on
                        log(f"  {t}: {type(exc).__name__}: {str(exc)[:100]}")
                res.sort(key=lambda r: r[0])
                log(f"[sweep {shape} bs {bs} ctx {ctx}] best: " + "; ".join(f"{us:.2f} µs {t}" for us, t in res[:4]))
                rows.append(dict(shape=shape, bs=bs, ctx=ctx, sweep=[(us, t.__dict__) for us, t in res]))
                del case
                torch.cuda.empty_cache()
    write_json(args.out, "decode_attn.json", rows)
    return 0


NCU_RANGE = "ncu"


def ncu_launches(shape: str, cases: str) -> None:
    """One shipped launch per case inside the NVTX range ``ncu``, compiled and warmed up outside it."""
    for spec in cases.split(","):
        bs, ctx, layout = spec.split(":")
        case = Case(SHAPES[shape], int(bs), int(ctx), layout=layout)
        layer = triton_layer(case)
        for i in range(case.layers):
            layer(i)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push(NCU_RANGE)
        layer(0)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        log(f"profiled: attention {shape} rows {bs} context {ctx} slots {layout}")
        del case, layer
        torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
