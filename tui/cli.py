"""The ``graphtop`` command line.

    graphtop [--model PATH] [engine options]                  the dashboard (demo model without --model)
    graphtop [--model PATH] --prompts FILE --output OUT.jsonl headless generation
    graphtop [--model PATH] --record TRACE.jsonl (--prompts FILE | --synthetic N)
    graphtop --replay TRACE.jsonl                             a recorded trace in the dashboard
    graphtop trace summary TRACE.jsonl
    graphtop trace export --perfetto TRACE.jsonl OUT.json

Usage errors print one line and exit 2, never a traceback. Textual is imported only for the
interactive modes, torch only once a model is needed.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, NoReturn, Optional, Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
# Read once, when torch loads OpenMP (torch is imported only later). OpenMP's default makes idle
# threads spin; on a small or busy CPU a spinning thread holds the core its team-mate needs, and a
# CPU decode step (hundreds of small parallel ops) then ran ~10x slower. Passive threads sleep.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not usage + error
        raise UsageError(message)


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be positive")
    return v


def _nonneg_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text} must be >= 0")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="graphtop", description="LLM inference with CUDA graphs you can watch.")
    p.add_argument("--model", help="Hugging Face checkpoint folder or .gguf file (default: the built-in demo model)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default auto)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   help="weights/activations dtype (default: bfloat16 on CUDA, float32 on CPU)")
    p.add_argument("--attention-backend", choices=["auto", "flashinfer", "torch"], default="auto")
    p.add_argument("--page-size", type=_positive_int, default=1, help="KV page size in tokens")
    p.add_argument("--chunked-prefill-size", type=_positive_int, default=2048,
                   help="max tokens one prefill step takes (longer prompts are chunked)")
    p.add_argument("--max-running-requests", type=_positive_int)
    p.add_argument("--max-total-tokens", type=_positive_int, help="cap on the KV pool size in tokens")
    p.add_argument("--max-context-len", type=_positive_int)
    p.add_argument("--mem-fraction-static", type=float, default=0.85,
                   help="CUDA: fraction of device memory for weights + KV pool")
    p.add_argument("--kv-budget-mb", type=_positive_int, default=512, help="CPU: KV pool budget in MiB")
    p.add_argument("--no-fused-kernels", dest="fused_kernels", action="store_false",
                   help="plain torch ops instead of the Triton kernels (CUDA bf16/fp16 only)")
    p.add_argument("--no-overlap-schedule", dest="overlap_schedule", action="store_false",
                   help="read each decode step's tokens back before launching the next one")
    g = p.add_argument_group("CUDA graphs")
    g.add_argument("--cuda-graph-config", metavar="JSON",
                   help='e.g. \'{"decode": {"backend": "full", "bs": [1,2,4,8]}, '
                        '"prefill": {"backend": "breakable", "num_tokens": [64,256]}}\' (beats the flags)')
    g.add_argument("--cuda-graph-backend-decode", choices=["full", "disabled"])
    g.add_argument("--cuda-graph-bs-decode", metavar="LIST", help="decode buckets, e.g. 1,2,4,8-64:8")
    g.add_argument("--cuda-graph-max-bs-decode", type=_positive_int)
    g.add_argument("--cuda-graph-backend-prefill", choices=["breakable", "disabled"])
    g.add_argument("--cuda-graph-num-tokens-prefill", metavar="LIST", help="prefill token buckets")
    g.add_argument("--cuda-graph-max-num-tokens-prefill", type=_positive_int)
    g.add_argument("--cuda-graph-max-padding-waste", type=_nonneg_float,
                   help="refuse a prefill graph when padding exceeds this fraction of the bucket")
    g.add_argument("--disable-cuda-graph", action="store_true", help="eager only (both phases)")
    g.add_argument("--no-graph-emulation", dest="graph_emulation", action="store_false",
                   help="without CUDA, serve eagerly (reason no_cuda_graphs) instead of emulating graphs")
    h = p.add_argument_group("headless")
    h.add_argument("--prompts", metavar="FILE", help="one JSON object or plain text prompt per line")
    h.add_argument("--output", metavar="OUT.jsonl", help="one result line per request")
    h.add_argument("--record", metavar="TRACE.jsonl", help="save the event trace")
    h.add_argument("--synthetic", type=_positive_int, metavar="N", help="N seeded synthetic requests")
    h.add_argument("--synthetic-prompt-len", default="uniform:16:256", metavar="DIST")
    h.add_argument("--synthetic-output-len", default="uniform:16:128", metavar="DIST")
    h.add_argument("--synthetic-rate", type=float, metavar="REQ_PER_S",
                   help="Poisson arrival rate (default: all at once)")
    h.add_argument("--seed", type=int, default=0)
    h.add_argument("--max-new-tokens", type=_positive_int, default=128)
    h.add_argument("--temperature", type=_nonneg_float, default=0.0)
    h.add_argument("--top-p", type=float, default=1.0)
    h.add_argument("--top-k", type=int, default=0)
    u = p.add_argument_group("dashboard")
    u.add_argument("--theme", help="graphtop-dark (default), graphtop-light or any Textual theme")
    u.add_argument("--replay", metavar="TRACE.jsonl", help="open a recorded trace in the dashboard")
    return p


def build_trace_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="graphtop trace", description="Inspect recorded traces.")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("summary", help="text report of a trace")
    s.error = p.error  # type: ignore[method-assign]
    s.add_argument("trace")
    e = sub.add_parser("export", help="export a trace")
    e.error = p.error  # type: ignore[method-assign]
    e.add_argument("--perfetto", action="store_true", required=True, help="Chrome trace-event JSON")
    e.add_argument("trace")
    e.add_argument("out")
    return p


def graph_flags(args: argparse.Namespace) -> dict[str, Any]:
    from graphtop.tui.bucket_parse import BucketSpecError, parse_buckets

    def buckets(text: Optional[str], flag: str) -> Optional[list[int]]:
        if text is None:
            return None
        try:
            return parse_buckets(text)
        except BucketSpecError as e:
            raise UsageError(f"{flag}: {e}") from None

    flags = {
        "decode.backend": args.cuda_graph_backend_decode,
        "decode.bs": buckets(args.cuda_graph_bs_decode, "--cuda-graph-bs-decode"),
        "decode.max_bs": args.cuda_graph_max_bs_decode,
        "prefill.backend": args.cuda_graph_backend_prefill,
        "prefill.num_tokens": buckets(args.cuda_graph_num_tokens_prefill, "--cuda-graph-num-tokens-prefill"),
        "prefill.max_num_tokens": args.cuda_graph_max_num_tokens_prefill,
        "prefill.max_padding_waste": args.cuda_graph_max_padding_waste,
    }
    if args.disable_cuda_graph:
        flags["decode.backend"] = "disabled"
        flags["prefill.backend"] = "disabled"
    return flags


def engine_config_from_args(args: argparse.Namespace) -> Any:
    from graphtop.engine.config import EngineConfig
    from graphtop.engine.graphs.config import GraphConfigError, build_graph_config

    try:
        graphs = build_graph_config(args.cuda_graph_config, graph_flags(args))
    except GraphConfigError as e:
        raise UsageError(str(e)) from None
    graphs.emulate = args.graph_emulation
    cfg = EngineConfig(
        device=args.device,
        dtype=args.dtype,
        attention_backend=args.attention_backend,
        page_size=args.page_size,
        chunked_prefill_size=args.chunked_prefill_size,
        max_running_requests=args.max_running_requests,
        max_context_len=args.max_context_len,
        mem_fraction_static=args.mem_fraction_static,
        cpu_kv_budget_mb=args.kv_budget_mb,
        max_total_tokens=args.max_total_tokens,
        fused_kernels=args.fused_kernels,
        overlap_schedule=args.overlap_schedule,
        graphs=graphs,
    )
    try:
        cfg.validate()
    except ValueError as e:
        raise UsageError(str(e)) from None
    return cfg


def _run_trace(argv: Sequence[str]) -> int:
    args = build_trace_parser().parse_args(argv)
    from graphtop.engine.telemetry.trace import TraceError, read_trace

    try:
        trace = read_trace(args.trace)
    except TraceError as e:
        raise UsageError(str(e)) from None
    if args.cmd == "summary":
        from graphtop.engine.telemetry.report import format_summary, summarize

        print(format_summary(summarize(trace)), end="")
        return 0
    from graphtop.engine.telemetry.perfetto import write_perfetto

    try:
        out = write_perfetto(trace, args.out)
    except OSError as e:
        raise UsageError(f"cannot write {args.out}: {e.strerror or e}") from None
    print(f"wrote {out} ({len(trace.events)} events); open it at ui.perfetto.dev")
    return 0


def _main(argv: Sequence[str]) -> int:
    if argv and argv[0] == "trace":
        return _run_trace(argv[1:])
    args = build_parser().parse_args(argv)
    if args.replay:
        if args.prompts or args.synthetic or args.record:
            raise UsageError("--replay opens a trace; it cannot be combined with a workload")
        from graphtop.tui.launch import run_replay

        return run_replay(args.replay, args.theme)
    headless = bool(args.prompts or args.synthetic or args.record or args.output)
    config = engine_config_from_args(args)
    if headless:
        from graphtop.tui.headless import run_headless

        return run_headless(args, config)
    if args.model is not None and not os.path.isdir(args.model):
        if not os.path.exists(args.model):
            raise UsageError(f"model folder {args.model} does not exist")
        if not (os.path.isfile(args.model) and args.model.lower().endswith(".gguf")):
            raise UsageError(f"model path {args.model} is not a folder (nor a .gguf file)")
    if args.device != "auto" or args.attention_backend == "flashinfer":
        # An explicit device or backend that cannot work fails here, not inside the dashboard.
        from graphtop.engine.attention.select import flashinfer_problem
        from graphtop.engine.engine import EngineError, resolve_device

        try:
            device = resolve_device(args.device)
        except EngineError as e:
            raise UsageError(str(e)) from None
        problem = flashinfer_problem(device) if args.attention_backend == "flashinfer" else None
        if problem:
            raise UsageError(f"--attention-backend flashinfer: {problem}")
    from graphtop.tui.launch import run_interactive

    return run_interactive(args.model, config, args.theme)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(argv)
    except UsageError as e:
        print(f"graphtop: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("graphtop: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    # `python -m graphtop.tui.cli`: run the imported module's main, so the UsageError that
    # headless.py raises (graphtop.tui.cli.UsageError) is the class main() catches.
    from graphtop.tui.cli import main as _main_of_package

    sys.exit(_main_of_package())
