"""Decode attention alone (q over cached K/V, no norm, RoPE or K/V store), per layer, in one CUDA graph
over L layers with a cache each: the engine's kernels (FlashInfer's fa2 decode, the Triton kernel; page
size 1) against FlashInfer's XQA decode (TensorRT-LLM's kernel, JIT-built; page sizes 16-128 only) and
fa2 at the same page sizes, so a page-size change is priced apart from a kernel change; at page size 1
also FlashInfer's tensor-core decode path (``--kernels fa2-tc,fa3-tc``: its fa2 or Hopper fa3 prefill kernels
over one query row per request). Each case's outputs are checked against the first kernel's before it is timed.

    python bench/attn_backend_probe.py [--shapes qwen3-0.6b,llama-3.1-8b] [--bs 64,256] [--ctx 193]
        [--pages 16,32] [--layouts NHD,HND] [--kernels fa2,triton,fa2-tc,fa3-tc]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from graphtop.engine.attention.flashinfer_backend import CUDA_CORE_DECODE_GROUPS  # noqa: E402
from graphtop.models.kernels.decode_attention import PagedDecode  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from decode_attn_bench import SHAPES, graph_us, log  # noqa: E402
from graph_bench import copy_bandwidth  # noqa: E402

D = 128
DT = torch.bfloat16
KV_BUDGET = 6 << 30


class PagedCase:
    """Per-layer K/V caches of one page size and layout, each row's pages shuffled over the pool."""

    def __init__(self, heads: tuple[int, int, bool], bs: int, ctx: int, page: int, layout: str, seed: int = 0):
        hq, hkv, _ = heads
        self.hq, self.hkv, self.bs, self.ctx, self.page, self.layout = hq, hkv, bs, ctx, page, layout
        self.pp = -(-ctx // page)
        pages = bs * self.pp + 1
        per_layer = 2 * pages * page * hkv * D * 2
        self.layers = max(2, min(16, KV_BUDGET // per_layer))
        g = torch.Generator(device="cuda").manual_seed(seed)
        shape = (pages, page, hkv, D) if layout == "NHD" else (pages, hkv, page, D)
        self.kc = [torch.randn(shape, device="cuda", dtype=DT, generator=g) for _ in range(self.layers)]
        self.vc = [torch.randn(shape, device="cuda", dtype=DT, generator=g) for _ in range(self.layers)]
        perm = torch.randperm(bs * self.pp, generator=torch.Generator().manual_seed(seed)) + 1
        self.table_h = perm.view(bs, self.pp).to(torch.int32)
        self.table = self.table_h.cuda()
        self.indptr_h = torch.arange(0, bs * self.pp + 1, self.pp, dtype=torch.int32)
        self.indices_h = self.table_h.reshape(-1)
        self.last_h = torch.full((bs,), ctx - (self.pp - 1) * page, dtype=torch.int32)
        self.seq_lens = torch.full((bs,), ctx, dtype=torch.int32, device="cuda").to(torch.uint32)
        self.q = torch.randn(bs, hq, D, device="cuda", dtype=DT, generator=g)

    def kv_bytes(self) -> int:
        return 2 * self.bs * self.ctx * self.hkv * D * 2


def fa2_layer(case: PagedCase, tensor_cores: bool | None = None, backend: str = "fa2") -> Callable[[int], Any]:
    """FlashInfer's decode wrapper; by default as the engine builds it (CUDA-core kernel for its GQA groups),
    or forced onto the tensor-core path (the prefill kernels of ``backend``, fa2 or Hopper's fa3)."""
    import flashinfer

    ws = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
    group = case.hq // case.hkv
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        ws, case.layout, use_cuda_graph=True,
        use_tensor_cores=group not in CUDA_CORE_DECODE_GROUPS if tensor_cores is None else tensor_cores,
        paged_kv_indptr_buffer=case.indptr_h.cuda(), paged_kv_indices_buffer=case.indices_h.cuda(),
        paged_kv_last_page_len_buffer=case.last_h.cuda(), backend=backend,
    )
    w.plan(case.indptr_h, case.indices_h, case.last_h, case.hq, case.hkv, D, case.page, pos_encoding_mode="NONE",
           q_data_type=DT, kv_data_type=DT, sm_scale=D**-0.5)

    def layer(i: int) -> Any:
        return w.run(case.q, (case.kc[i], case.vc[i]))

    layer.keep = (ws, w)  # type: ignore[attr-defined]
    return layer


def xqa_layer(case: PagedCase) -> Callable[[int], Any]:
    from flashinfer.decode import xqa_batch_decode_with_kv_cache

    ws = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
    out = torch.empty_like(case.q)

    def layer(i: int) -> Any:
        return xqa_batch_decode_with_kv_cache(case.q, (case.kc[i], case.vc[i]), ws, case.table, case.seq_lens,
                                              case.pp * case.page, bmm1_scale=D**-0.5, out=out,
                                              kv_layout=case.layout)

    layer.keep = (ws, out)  # type: ignore[attr-defined]
    return layer


def triton_layer(case: PagedCase) -> Callable[[int], Any]:
    kern = PagedDecode(case.hq, case.hkv, D, case.page, D**-0.5, case.bs, torch.device("cuda"))
    indptr, indices, last = case.indptr_h.cuda(), case.indices_h.cuda(), case.last_h.cuda()

    def layer(i: int) -> Any:
        return kern.run(case.q, case.kc[i], case.vc[i], indptr, indices, last)

    return layer


KERNELS: dict[str, Callable[[PagedCase], Callable[[int], Any]]] = {
    "fa2": fa2_layer, "xqa": xqa_layer, "triton": triton_layer,
    "fa2-tc": lambda case: fa2_layer(case, tensor_cores=True, backend="fa2"),
    "fa3-tc": lambda case: fa2_layer(case, tensor_cores=True, backend="fa3"),
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="qwen3-0.6b,llama-3.1-8b")
    ap.add_argument("--bs", default="64,256")
    ap.add_argument("--ctx", default="193")
    ap.add_argument("--pages", default="16,32")
    ap.add_argument("--layouts", default="NHD,HND")
    ap.add_argument("--kernels", default="fa2,triton",
                    help="at page size 1: fa2 (as the engine builds it), triton, fa2-tc, fa3-tc (tensor-core path)")
    args = ap.parse_args()
    bw = copy_bandwidth(torch.device("cuda"))
    log(f"copy bandwidth {bw / 1e12:.2f} TB/s")
    log("| shape | bs | ctx | page | layout | kernel | µs/layer | ÷ K/V bytes' time | max |Δ| vs fa2 |")
    log("|---|---|---|---|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        for bs in map(int, args.bs.split(",")):
            for ctx in map(int, args.ctx.split(",")):
                plans = [(1, "NHD", tuple(args.kernels.split(",")))]
                plans += [(p, lay, ("fa2", "xqa")) for p in map(int, filter(None, args.pages.split(","))) for lay in args.layouts.split(",")]
                for page, layout, kernels in plans:
                    case = PagedCase(SHAPES[shape], bs, ctx, page, layout)
                    kv_us = case.kv_bytes() / bw * 1e6
                    ref = None
                    for name in kernels:
                        try:
                            fn = KERNELS[name](case)
                            o = fn(0).float().clone()
                            ref = o if ref is None else ref
                            err = (o - ref).abs().max().item()
                            us = graph_us(case, fn)  # type: ignore[arg-type]  (it reads only .layers)
                            log(f"| {shape} | {bs} | {ctx} | {page} | {layout} | {name} | {us:.2f} | {us / kv_us:.2f}× | {err:.3g} |")
                        except Exception as exc:  # a kernel this build cannot make: report and go on
                            log(f"| {shape} | {bs} | {ctx} | {page} | {layout} | {name} | failed: {type(exc).__name__}: {str(exc)[:300]} |")
                    del case
                    torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
