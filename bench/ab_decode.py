"""Interleaved A/B of decode-path variants on one checkpoint: every variant is its own engine (its
graphs captured under its settings), all serving the same batch side by side; timing rounds alternate
between them, so clock drift and context growth hit every variant alike. Prints each variant's median
graph step and its ratio to the HBM floor (bench/harness.py). Each engine's KV pool holds every row's
context up to the last timed step (``final_context``), so the batch runs whole; a prompt whose run would
outgrow the benchmark's context is refused.

    python3 bench/ab_decode.py [--shapes qwen3-0.6b,llama-3.1-8b] [--bs 1] [--rounds 8] [--steps 20]
        [--variants "pdl=auto;pdl=off;pdl=on;pdl=auto"]  (the default; also e.g. "pdl=off,tuning=64/64/4/2")

A variant sets the PDL policy (pdl=auto|on|off, ``KernelConfig.pdl``), the decode kernel
(decode=auto|flashinfer|triton|..., ``KernelConfig.decode_kernel``), the KV page size (page=N) and/or
the Triton decode launch shape below ``LARGE_ROWS`` rows (tuning=..., for every GQA group; small=...,
for groups up to ``SMALL_GROUP`` only; one=..., one row of the larger groups; default=..., 2 or more rows of
the larger groups), from ``LARGE_ROWS`` and from ``HUGE_ROWS`` rows (large=... /
huge=...), each block_t/min_chunk/warps/stages[/prefetch 0, 1 or 2[/waves[/maxnreg]]] and the skinny GEMM
(skinny=auto|off,
``KernelConfig.skinny_gemm``; tuned=FILE adds configs from ``bench/skinny_bench.py --tuned-out`` over
the shipped ones, sk=N:K:row_class:silu:block_n:block_k:split:warps:stages[+...] adds or replaces some (split 0
or -2: stream-K over one or two programs an SM; streamk=0 or -2 turns every config so far into that),
sk=N:K:row_class:silu puts one back on cuBLAS) for the engines built under it. logits=float32 captures the
decode graphs with float32 logits (a float copy, then a copy into a float output buffer);
group=N moves ``TRITON_AUTO_GROUP`` (group=99: FlashInfer above 64 rows, whatever the GQA group);
pdl_max=MiB moves ``PDL_AUTO_MAX_BYTES``, the largest fused GEMV that pdl=auto launches with PDL;
gemv=N:K:block_n:block_k:warps:stages[:split][+...] replaces fused-GEMV launch configs; gemv_trigger=off
launches the gate|up GEMV (no PDL) without letting the down projection after it start early; upload=separate replays
decode graphs the way they were before one upload a step (separate copies, the argmax after the graph);
blas=cublaslt|cublas captures the engine's graphs with that ``torch.backends.cuda.preferred_blas_library``
(a graph keeps the GEMM kernels chosen at capture, so engines of either library can be interleaved);
h2d=compute sends a step's upload on the compute stream, in line with its scatter, instead of on the
uploader's copy stream; readback=copy copies the greedy tokens to the host after each decode replay
instead of having the graph write them into a pinned ring; silu_pdl=off launches the SiLU·mul kernel
(between a cuBLAS gate|up and a skinny down) without programmatic dependent launch; norms=separate runs
a layer's add+RMSNorms as their own kernels where the skinny GEMM would carry them
(``skinny_tuning.NORMS_IN_PROJECTIONS`` off); post_norm=64 (16+64, none) sets the row classes where
the post-attention add+RMSNorm alone runs as its own kernel (``skinny_tuning.POST_NORM_APART``, both shapes);
lm_head=cublas leaves the final RMSNorm and the lm_head to their own kernel and cuBLAS at every size (at the
fused GEMV's rows, ``gemv.LM_HEAD_GEMV`` off; at the skinny GEMM's, its lm_head configs removed);
argmax_pdl=off launches the greedy argmax without PDL; mlp=fused runs each layer's MLP at the fused GEMV's
rows in one launch (``KernelConfig.fused_mlp`` "on", models/kernels/fused_mlp.py), mlp=gemv in the two GEMVs
(the default); fmlp=H:I:block_i:block_k:block_h:warps:stages:group[+...] replaces its launch configs
(``fused_mlp.DEFAULTS``); gemv_rows=N runs the fused-GEMV layers for steps of up to N tokens (at most 4;
``EngineConfig.fused_gemv_max_rows``, default 1), e.g. to measure either MLP at 2-4 rows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from types import MethodType

import torch
from harness import (
    PROMPT_LEN,
    comma_ints,
    copy_bandwidth,
    drain,
    fill_decode,
    floor_ms,
    interleaved,
    log,
    make_engine,
    random_ckpt,
    refuse_past_context,
    release_cuda,
    time_steps,
)

from graphtop.engine.attention import decode_policy as dp
from graphtop.engine.graphs import upload as gu
from graphtop.engine.graphs.backend import ShapeKey
from graphtop.engine.graphs.bucket_policy import BucketDecision, pick_graph_width
from graphtop.engine.graphs.runners import decode_graph as dg
from graphtop.engine.graphs.runners.base import StepOutput
from graphtop.engine.graphs.runners.decode_graph import DecodeGraphRunner
from graphtop.engine.kernel_config import KernelConfig
from graphtop.models.kernels import decode_attention_tuning as td
from graphtop.models.kernels import fused as tk
from graphtop.models.kernels import fused_mlp as tm
from graphtop.models.kernels import gemv as tg
from graphtop.models.kernels import skinny_tuning as st
from graphtop.models.kernels.argmax import argmax_rows

SHIPPED_TUNING = (td.DEFAULT_TUNING, td.SMALL_GROUP_TUNING, td.LARGE_TUNING, td.HUGE_TUNING, td.ONE_ROW_TUNING)
SHIPPED_SKINNY = dict(st.TUNED)
SHIPPED_FORWARD = DecodeGraphRunner._forward
SHIPPED_RUN = DecodeGraphRunner.run
SHIPPED_GROUP = dp.TRITON_AUTO_GROUP
SHIPPED_PDL_MAX = tk.PDL_AUTO_MAX_BYTES
SHIPPED_SILU_PDL = tk.SILU_MUL_PDL
SHIPPED_NORMS = st.NORMS_IN_PROJECTIONS
SHIPPED_POST_NORM = st.POST_NORM_APART
SHIPPED_GEMV = dict(tg.TUNED)
SHIPPED_FUSED_MLP = dict(tm.DEFAULTS)
SHIPPED_TRIGGER = tg.TRIGGER_NEXT
SHIPPED_BLAS = torch.backends.cuda.preferred_blas_library()
SHIPPED_COPY_STREAM = gu.COPY_STREAM
SHIPPED_HOST_RING = dg.HOST_RING
SHIPPED_LM_HEAD = tg.LM_HEAD_GEMV
LM_HEAD_ROWS = {151936, 128256}  # the benchmark shapes' vocabularies: skinny configs of an lm_head
SHIPPED_ARGMAX = dg.argmax_rows


def _argmax_without_pdl(*args, pdl: bool = False, **kwargs) -> torch.Tensor:
    """The decode graph's greedy argmax launched plainly (variant argmax_pdl=off)."""
    return SHIPPED_ARGMAX(*args, **kwargs)


def _float_logits_forward(self: DecodeGraphRunner, bs: int) -> torch.Tensor:
    """The decode graph's body before logits stayed in the model's dtype (variant logits=float32)."""
    self.attention.prepare_in_graph()
    hidden = self.model(self.registry.view("input_ids", bs), self.registry.view("positions", bs), self.attention)
    if getattr(self, "_float_out", None) is None:
        self._float_out = torch.zeros(self.logits_out.shape, dtype=torch.float32, device=self.logits_out.device)
    out = self._float_out[:bs]
    out.copy_(self.model.lm_head(hidden).float())
    argmax_rows(out, out=self.tokens_out[:bs], host_ring=self.host_ring)
    return out


def _separate_copies_forward(self: DecodeGraphRunner, bs: int) -> torch.Tensor:
    """The decode graph's body before it took the greedy tokens itself (variant upload=separate)."""
    self.attention.prepare_in_graph()
    hidden = self.model(self.registry.view("input_ids", bs), self.registry.view("positions", bs), self.attention)
    return self.model.compute_logits(hidden, out=self.logits_out[:bs])


def _separate_copies_run(self: DecodeGraphRunner, batch, decision: BucketDecision) -> StepOutput:
    """A decode replay as before one upload a step (variant upload=separate): the static buffers' own
    copy, the overlap schedule's ids copied device to device, the attention page lists uploaded by the
    backend (three copies), and the greedy argmax launched after the graph (StepOutput.tokens unset)."""
    bs = batch.batch_size
    bucket = decision.bucket
    self.registry.fill(batch, bucket)
    if batch.input_ids_device is not None:
        self.registry.view("input_ids", bs).copy_(batch.input_ids_device)
    width = pick_graph_width(self.widths, batch.max_pages)
    self.attention.bind_graph_meta(self.registry, bucket, self._meta_width(width, batch.max_pages))
    self.attention.prepare_replay(batch, bucket)
    logits, timing = self.backend.replay(ShapeKey(self.phase, bucket, width))
    return StepOutput(logits=logits[:bs], path="graph", bucket=bucket, padded=decision.padded, timing=timing)


def parse_tuning(text: str) -> td.DecodeTuning:
    """A Triton decode launch shape written block_t/min_chunk/warps/stages[/prefetch[/waves[/maxnreg]]]."""
    return td.DecodeTuning(*map(int, text.split("/")))


def apply(variant: str) -> dict:
    """The variant's engine overrides (kernel config, page size); its launch shape (a module default)
    is set for the engines built next."""
    kernel: dict[str, str] = {}
    overrides: dict = {}
    td.DEFAULT_TUNING, td.SMALL_GROUP_TUNING, td.LARGE_TUNING, td.HUGE_TUNING, td.ONE_ROW_TUNING = SHIPPED_TUNING
    st.TUNED.clear()
    st.TUNED.update(SHIPPED_SKINNY)
    DecodeGraphRunner._forward = SHIPPED_FORWARD
    DecodeGraphRunner.run = SHIPPED_RUN
    dp.TRITON_AUTO_GROUP = SHIPPED_GROUP
    tk.PDL_AUTO_MAX_BYTES = SHIPPED_PDL_MAX
    tk.SILU_MUL_PDL = SHIPPED_SILU_PDL
    st.NORMS_IN_PROJECTIONS = SHIPPED_NORMS
    st.POST_NORM_APART = SHIPPED_POST_NORM
    tg.TUNED.clear()
    tg.TUNED.update(SHIPPED_GEMV)
    tm.DEFAULTS.clear()
    tm.DEFAULTS.update(SHIPPED_FUSED_MLP)
    tg.TRIGGER_NEXT = SHIPPED_TRIGGER
    torch.backends.cuda.preferred_blas_library(SHIPPED_BLAS)
    gu.COPY_STREAM = SHIPPED_COPY_STREAM
    dg.HOST_RING = SHIPPED_HOST_RING
    tg.LM_HEAD_GEMV = SHIPPED_LM_HEAD
    dg.argmax_rows = SHIPPED_ARGMAX
    for item in filter(None, variant.split(",")):
        key, value = item.split("=")
        if key == "pdl":
            kernel["pdl"] = value
        elif key == "decode":
            kernel["decode_kernel"] = value
        elif key == "page":
            overrides["page_size"] = int(value)
        elif key == "tuning":  # below LARGE_ROWS, whatever the GQA group and row count
            td.DEFAULT_TUNING = td.SMALL_GROUP_TUNING = td.ONE_ROW_TUNING = parse_tuning(value)
        elif key == "default":  # 2 .. LARGE_ROWS - 1 rows of GQA groups above SMALL_GROUP only
            td.DEFAULT_TUNING = parse_tuning(value)
        elif key == "small":  # below LARGE_ROWS for GQA groups up to SMALL_GROUP only
            td.SMALL_GROUP_TUNING = parse_tuning(value)
        elif key == "one":  # one row, GQA groups above SMALL_GROUP
            td.ONE_ROW_TUNING = parse_tuning(value)
        elif key == "large":
            td.LARGE_TUNING = parse_tuning(value)
        elif key == "huge":
            td.HUGE_TUNING = parse_tuning(value)
        elif key == "tuned":  # skinny configs from bench/skinny_bench.py --tuned-out, over the shipped ones
            st.TUNED.update({tuple(k): tuple(c) for k, c in json.loads(Path(value).read_text())})
        elif key == "sk":  # N:K:row_class:silu:block_n:block_k:split:warps:stages[+...], over the shipped ones
            for entry in value.split("+"):  # without a config: that projection back on cuBLAS
                n, k, cls, silu, *cfg = map(int, entry.split(":"))
                if cfg:
                    st.TUNED[(n, k, cls, bool(silu))] = tuple(cfg)
                else:
                    st.TUNED.pop((n, k, cls, bool(silu)), None)
        elif key == "streamk":  # every skinny config (shipped and sk= so far) on stream-K: 0 or -2
            st.TUNED.update({kk: c[:2] + (int(value),) + c[3:] for kk, c in st.TUNED.items()})
        elif key == "skinny":
            kernel["skinny_gemm"] = value
        elif key == "group":  # decode=auto takes the Triton kernel at every size from this GQA group on
            dp.TRITON_AUTO_GROUP = int(value)
        elif key == "pdl_max":  # pdl=auto's weight limit in MiB (fused GEMVs of at most this many get PDL)
            tk.PDL_AUTO_MAX_BYTES = int(value) << 20
        elif key == "gemv":  # N:K:block_n:block_k:warps:stages[+...], over the shipped GEMV configs
            for entry in value.split("+"):
                n, k, *cfg = map(int, entry.split(":"))
                tg.TUNED[(n, k)] = tuple(cfg)
        elif key == "mlp" and value in ("fused", "gemv"):  # the MLP in one launch, or the two GEMVs
            kernel["fused_mlp"] = "on" if value == "fused" else "off"
        elif key == "gemv_rows":
            overrides["fused_gemv_max_rows"] = int(value)
        elif key == "fmlp":  # H:I:block_i:block_k:block_h:warps:stages:group[+...], over the fused MLP's defaults
            for entry in value.split("+"):
                hidden, inter, *cfg = map(int, entry.split(":"))
                tm.DEFAULTS[(hidden, inter)] = tm.FusedMLPConfig(*cfg)
        elif key == "gemv_trigger" and value == "off":  # a plain GEMV launch no longer lets the next start early
            tg.TRIGGER_NEXT = False
        elif key == "upload" and value == "separate":
            DecodeGraphRunner._forward = _separate_copies_forward
            DecodeGraphRunner.run = _separate_copies_run
        elif key == "silu_pdl" and value == "off":  # the SiLU·mul kernel launched without PDL
            tk.SILU_MUL_PDL = False
        elif key == "post_norm":  # row classes (16+64, or none) whose post-attention add+RMSNorm runs apart
            st.POST_NORM_APART = frozenset(
                (h, int(c)) for h in (1024, 4096) for c in value.split("+") if value != "none"
            )
        elif key == "norms" and value == "separate":  # add+RMSNorm kernels between the skinny projections
            st.NORMS_IN_PROJECTIONS = False
        elif key == "h2d" and value == "compute":  # the step's upload on the compute stream, in line
            gu.COPY_STREAM = False
        elif key == "readback" and value == "copy":  # the tokens copied to the host after each replay
            dg.HOST_RING = 0
        elif key == "blas":
            torch.backends.cuda.preferred_blas_library(value)
        elif key == "lm_head" and value == "cublas":  # the final RMSNorm kernel, then cuBLAS, at every size
            tg.LM_HEAD_GEMV = False
            for shape_key in [kk for kk in st.TUNED if kk[0] in LM_HEAD_ROWS]:
                del st.TUNED[shape_key]
        elif key == "argmax_pdl" and value == "off":  # the greedy argmax's two kernels launched plainly
            dg.argmax_rows = _argmax_without_pdl
        elif key == "logits" and value == "float32":
            DecodeGraphRunner._forward = _float_logits_forward
        else:
            raise SystemExit(f"unknown variant key {key!r}")
    return {"kernels": KernelConfig(**kernel), **overrides}


def final_context(prompt: int, args: argparse.Namespace) -> int:
    """A request's context at the last timed step: its prompt, the prefill's token, 5 warm-up steps and
    every round. The KV pool must hold that for every row, or the batch would shrink or be preempted
    mid-measurement (and the floor, computed for every row, would be wrong)."""
    return prompt + 1 + 5 + args.rounds * args.steps


def compare(shape: str, ckpt, bs: int, prompt: int, variants: list[str], args: argparse.Namespace, bw: float) -> None:
    engines, handles = [], []
    tokens = final_context(prompt, args)
    for v in variants:
        eng = make_engine(
            ckpt,
            "flashinfer",
            graphs=True,
            max_running=max(8, bs),
            decode_bs=[bs],
            prefill_graphs=False,
            longest_context=tokens,
            **apply(v),
        )
        if eng.kv_capacity_tokens < bs * tokens:
            raise SystemExit(
                f"the KV pool holds {eng.kv_capacity_tokens} tokens, fewer than {bs} rows x "
                f"{tokens}: lower --bs or --prompt"
            )
        if DecodeGraphRunner.run is not SHIPPED_RUN:  # per engine: the class's run is reset for the next
            runner = eng.model_runner.decode
            runner.run = MethodType(DecodeGraphRunner.run, runner)
        engines.append(eng)
        handles.append(fill_decode(eng, bs, prompt_len=prompt))
        time_steps(eng, 5)
    apply("")
    figures = interleaved(
        {str(i): (lambda e=eng: time_steps(e, args.steps)) for i, eng in enumerate(engines)}, args.rounds
    )
    times = list(figures.values())
    ctx = prompt + 5 + args.rounds * args.steps // 2  # the middle of the timed steps
    floor = floor_ms(ckpt.model, [ctx] * bs, bw)
    base = statistics.median(times[0])
    for v, t in zip(variants, times):
        med = statistics.median(t)
        log(
            f"[{shape} bs {bs}, context ~{ctx}] {v or 'defaults':40s} graph step {med:.3f} ms "
            f"(min {min(t):.3f})  ÷ floor {floor:.3f} = {med / floor:.3f}×  ÷ first {med / base:.3f}"
        )
    for eng, h in zip(engines, handles):
        drain(eng, h)
        eng.close()
    del engines, handles
    release_cuda()


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="qwen3-0.6b,llama-3.1-8b")
    ap.add_argument("--variants", default="pdl=auto;pdl=off;pdl=on;pdl=auto")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--bs", default="1", help="batch sizes, comma list")
    ap.add_argument("--prompt", default=str(PROMPT_LEN), help="prompt tokens, comma list (context = prompt + steps)")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    for prompt in comma_ints(args.prompt):
        refuse_past_context(
            ap, final_context(prompt, args), f"prompt {prompt} and {args.rounds} rounds of {args.steps} steps"
        )
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device")
    bw = copy_bandwidth(torch.device("cuda"))
    log(f"copy bandwidth {bw / 1e12:.2f} TB/s")
    variants = args.variants.split(";")
    for shape in args.shapes.split(","):
        ckpt = random_ckpt(shape)
        for prompt in comma_ints(args.prompt):
            for bs in comma_ints(args.bs):
                compare(shape, ckpt, bs, prompt, variants, args, bw)
        del ckpt
        release_cuda()
    return 0


if __name__ == "__main__":
    sys.exit(main())
