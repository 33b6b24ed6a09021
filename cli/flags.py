"""The flags the main command and ``graphtop serve`` share, and the parser class of every command.

``add_engine_flags`` adds the model, engine and CUDA-graph flags, ``add_telemetry_flag`` the
``--telemetry`` flag; ``engine_config_from_args`` reads them into an ``EngineConfig`` (a UsageError
for a bad combination). torch is imported only inside the functions that build the config.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, NoReturn, Optional

from graphtop.engine.arguments import short_repr

from .aliases import DTYPES, dtype_value, names
from .flag_types import file_path, finite_float, nonempty, nonneg_int, positive_float, positive_int
from .usage import UsageError


class _Parser(argparse.ArgumentParser):
    """Every parser of the CLI (subparsers too: argparse makes them of their parent's class).

    Abbreviations are off: with them ``--mem-fraction`` silently meant ``--mem-fraction-static``, and a
    flag added later could change what an abbreviation on someone's command line means."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:  # one line, not usage + error
        raise UsageError(message)


def add_engine_flags(p: argparse.ArgumentParser) -> None:
    """The model, engine and CUDA-graph flags: the main command's, and ``graphtop serve``'s."""
    p.add_argument(
        "--model",
        type=file_path,
        help="Hugging Face checkpoint folder or .gguf file (default: the built-in demo model)",
    )
    p.add_argument(
        "--allow-external-weights",
        action="store_true",
        help="accept checkpoint files that are symbolic links out of the folder (HF cache snapshots)",
    )
    p.add_argument(
        "--chat-template",
        type=nonempty("chat template"),
        metavar="FILE|TEMPLATE",
        help="a Jinja chat template, or a file holding one, used instead of the tokenizer's (default: the "
        "tokenizer's own)",
    )
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="accepted so vLLM and SGLang command lines run; it does nothing: graphtop never runs code "
        "from a checkpoint",
    )
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default auto)")
    p.add_argument(
        "--dtype",
        type=dtype_value,
        metavar="{" + ",".join(DTYPES) + "}",
        help="weights/activations dtype; half = float16, float = float32 (default: auto, bfloat16 on CUDA, "
        "float32 on CPU)",
    )
    p.add_argument("--attention-backend", choices=["auto", "flashinfer", "torch"], default="auto")
    p.add_argument("--page-size", type=positive_int, default=1, help="KV page size in tokens")
    p.add_argument(
        "--chunked-prefill-size",
        type=positive_int,
        default=2048,
        help="max tokens one prefill step takes (longer prompts are chunked)",
    )
    p.add_argument(*names("--max-running-requests"), type=positive_int)
    p.add_argument("--max-total-tokens", type=positive_int, help="cap on the KV pool size in tokens")
    p.add_argument(*names("--max-context-len"), type=positive_int)
    p.add_argument(
        *names("--mem-fraction-static"),
        type=finite_float(0.0, 1.0, lo_open=True),
        default=0.85,
        help="CUDA: fraction of device memory for weights + KV pool",
    )
    p.add_argument("--kv-budget-mb", type=positive_int, default=512, help="CPU: KV pool budget in MiB")
    p.add_argument(
        "--no-fused-kernels",
        dest="fused_kernels",
        action="store_false",
        help="plain torch ops instead of the Triton kernels (CUDA bf16/fp16 only)",
    )
    p.add_argument(
        "--no-overlap-schedule",
        dest="overlap_schedule",
        action="store_false",
        help="read each decode step's tokens back before launching the next one",
    )
    p.add_argument(
        "--parity-every",
        type=nonneg_int,
        default=0,
        metavar="N",
        help="re-run one graph step in N eagerly and compare logits (default 0: off)",
    )
    p.add_argument(
        "--parity-tolerance",
        type=positive_float,
        metavar="F",
        help="relative logit error over which a parity check is a mismatch (default: by dtype)",
    )
    p.add_argument(
        *names("--tp"),
        type=positive_int,
        default=1,
        metavar="N",
        help="tensor parallel over N ranks: N GPUs (cuda:0..N-1) or N CPU processes (default 1)",
    )
    g = p.add_argument_group("CUDA graphs")
    g.add_argument(
        "--cuda-graph-config",
        type=nonempty("JSON config"),
        metavar="JSON",
        help='e.g. \'{"decode": {"backend": "full", "bs": [1,2,4,8]}, '
        '"prefill": {"backend": "breakable", "num_tokens": [64,256]}}\' (beats the flags)',
    )
    g.add_argument("--cuda-graph-backend-decode", choices=["full", "disabled"])
    g.add_argument("--cuda-graph-bs-decode", metavar="LIST", help="decode buckets, e.g. 1,2,4,8-64:8")
    g.add_argument("--cuda-graph-max-bs-decode", type=positive_int)
    g.add_argument("--cuda-graph-backend-prefill", choices=["breakable", "disabled"])
    g.add_argument("--cuda-graph-num-tokens-prefill", metavar="LIST", help="prefill token buckets")
    g.add_argument("--cuda-graph-max-num-tokens-prefill", type=positive_int)
    g.add_argument(
        "--cuda-graph-max-padding-waste",
        type=finite_float(0.0),
        help="refuse a prefill graph when padding exceeds this fraction of the bucket",
    )
    g.add_argument(*names("--disable-cuda-graph"), action="store_true", help="eager only (both phases)")
    g.add_argument(
        "--no-graph-emulation",
        dest="graph_emulation",
        action="store_false",
        help="without CUDA, serve eagerly (reason no_cuda_graphs) instead of emulating graphs",
    )
    g.add_argument(
        "--capture-before-serving",
        action="store_true",
        help="capture every graph before serving the first request (benchmarks); by default the "
        "engine serves at once, eagerly (not_yet_captured) until each step's bucket is captured",
    )


def add_telemetry_flag(t: Any) -> None:
    t.add_argument(
        "--telemetry",
        nargs="?",
        const="ipc",
        type=nonempty("address"),
        metavar="ADDRESS",
        help="serve events on an endpoint viewers attach to (graphtop attach): ipc (default, a "
        "private Unix socket) or tcp://HOST:PORT (prints a token); the dashboard always serves",
    )


def graph_flags(args: argparse.Namespace) -> dict[str, Any]:
    from graphtop.engine.graphs.bucket_list import BucketList, BucketSpecError

    def buckets(text: Optional[str], flag: str) -> Optional[BucketList]:
        if text is None:
            return None
        try:
            return BucketList.parse(text)
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


MAX_TEMPLATE_BYTES = 1 << 20
"""A chat template file larger than this is not a template (a checkpoint or a log named by mistake)."""


def chat_template_text(value: Optional[str]) -> Optional[str]:
    """``--chat-template``: the text of a file, or the value itself when it is a Jinja template (vLLM reads
    it the same way), compiled here so a broken template is refused before the model loads."""
    from graphtop.models import CheckpointError
    from graphtop.models.checkpoint.tokenizer_check import check_template_text

    if value is None:
        return None
    if os.path.isfile(value):
        try:
            if os.path.getsize(value) > MAX_TEMPLATE_BYTES:
                raise UsageError(f"--chat-template: {value} is over {MAX_TEMPLATE_BYTES >> 20} MiB: not a template")
            with open(value, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"--chat-template: cannot read {value}: {getattr(e, 'strerror', None) or e}") from None
        where = value
    elif "{{" in value or "{%" in value:
        text, where = value, "--chat-template"
    else:
        raise UsageError(f"--chat-template: {short_repr(value)} is neither a file nor a Jinja template")
    try:
        check_template_text(text, where)
    except CheckpointError as e:
        raise UsageError(f"--chat-template: {e}") from None
    return text


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
        parity_every=args.parity_every,
        parity_tolerance=args.parity_tolerance,
        allow_external_weights=args.allow_external_weights,
        tp_size=args.tp,
        capture_before_serving=args.capture_before_serving,
        chat_template=chat_template_text(args.chat_template),
        graphs=graphs,
    )
    try:
        cfg.validate()
    except ValueError as e:
        raise UsageError(str(e)) from None
    return cfg
