"""The 256-row projections on every bf16 GEMM the device's FlashInfer offers for sm90, against cuBLAS.

    python bench/gemm_backend_probe.py [--shapes qwen3-0.6b,llama-3.1-8b] [--m 256]

Why: the issue #17 targets at 256 rows need the projections faster than cuBLAS (README, Benchmarks);
Triton designs, cuBLASLt and TunableOp lost or tied. This tries what else ships in the FlashInfer
bundle: ``mm_bf16`` on cuDNN, cuBLASLt (heuristic search) and cuTile, and CUTLASS's sm90 grouped GEMM
(``SegmentGEMMWrapper(backend="sm90")``, one segment). Each candidate runs the op once per layer over
distinct weight copies in one CUDA graph (``gemv_bench.graph_us``), or eagerly between two events where
it cannot be captured; its output is checked against cuBLAS's before it is timed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemv_bench import graph_us, ops_for  # noqa: E402

Op = Callable[[int], torch.Tensor]


def eager_us(fn: Op, layers: int, reps: int = 7) -> float:
    for l in range(layers):
        fn(l)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for l in range(layers):
            fn(l)
        b.record()
        b.synchronize()
        best = min(best, a.elapsed_time(b) * 1e3 / layers)
    return best


def candidates(x: torch.Tensor, ws: list[torch.Tensor], out: torch.Tensor) -> dict[str, Op]:
    """name -> fn(layer) writing ``out`` (x @ W[layer].T); a backend that cannot be set up is left out."""
    import flashinfer

    found: dict[str, Op] = {"cublas": lambda l: torch.mm(x, ws[l].t(), out=out)}
    for backend in ("cudnn", "cublaslt", "cutile"):
        def run(l: int, backend: str = backend) -> torch.Tensor:
            return flashinfer.mm_bf16(x, ws[l].t(), out=out, backend=backend)
        found[f"mm_bf16/{backend}"] = run
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device=x.device)
    segment = flashinfer.SegmentGEMMWrapper(workspace, backend="sm90")
    seg_indptr = torch.tensor([0, x.shape[0]], dtype=torch.int64, device=x.device)
    stacked = [w.unsqueeze(0) for w in ws]

    def run_segment(l: int) -> torch.Tensor:
        return segment.run(x, stacked[l], 1, True, out=out, seg_indptr=seg_indptr)
    found["cutlass-sm90-segment"] = run_segment
    return found


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="qwen3-0.6b,llama-3.1-8b")
    ap.add_argument("--m", type=int, default=256)
    ap.add_argument("--weight-bytes", type=float, default=2e9, help="weight copies per op, in bytes, at least 2")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    for shape in args.shapes.split(","):
        for name, n, k, _ in ops_for(shape):
            layers = max(2, min(16, int(args.weight_bytes // (n * k * 2))))
            ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k**0.5 for _ in range(layers)]
            x = torch.randn(args.m, k, device=dev, dtype=torch.bfloat16)
            out = torch.empty(args.m, n, device=dev, dtype=torch.bfloat16)
            want = F.linear(x, ws[0]).float()
            flop = 2 * args.m * n * k
            row = [f"{shape} {name} M={args.m} N={n} K={k} ({layers} copies):"]
            for cand, fn in candidates(x, ws, out).items():
                t0 = time.perf_counter()
                try:
                    fn(0)
                    torch.cuda.synchronize()
                    err = (out.float() - want).abs().max().item()
                    if err > 0.05 * want.abs().max().item():
                        row.append(f"  {cand}: WRONG (max err {err:.3g})")
                        continue
                    try:
                        us, how = graph_us(fn, layers), "graph"
                    except Exception:  # noqa: BLE001 - a backend that cannot be captured is timed eagerly
                        torch.cuda.synchronize()
                        us, how = eager_us(fn, layers), "eager"
                    row.append(f"  {cand}: {us:.2f} us ({flop / us / 1e6:.0f} TFLOP/s, {how}, "
                               f"first call {time.perf_counter() - t0:.1f} s, max err {err:.2g})")
                except Exception as e:  # noqa: BLE001 - report the backend as unavailable and go on
                    torch.cuda.synchronize()
                    row.append(f"  {cand}: unavailable ({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''})")
            print("\n".join(row), flush=True)
            del ws, x, out
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
