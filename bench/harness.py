"""The benchmarks' shared harness: random-weight engines of the published shapes, the HBM floor and the
copy bandwidth it divides by, timing (whole serving steps, CUDA-graph replays between CUDA events,
interleaved rounds and their medians; the event stream's cost), and the result tables and JSON files.

Why one module: a figure must mean the same in every table. A step is timed the same way, a floor counts
the same bytes and an A/B is interleaved the same way whichever script reports it. Scripts import it as
``from harness import ...`` (a script's own folder is first on ``sys.path``); the tests import it the
same way (pytest's ``pythonpath`` holds ``bench``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, TypeVar

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402

from graphtop.engine.config import EngineConfig  # noqa: E402
from graphtop.engine.engine import Engine  # noqa: E402
from graphtop.engine.graphs.config import GraphConfig  # noqa: E402
from graphtop.engine.sampling_params import SamplingParams  # noqa: E402
from graphtop.engine.telemetry.bus import EventBus  # noqa: E402
from graphtop.engine.telemetry.recorder import TraceRecorder  # noqa: E402
from graphtop.models.synthetic.random_model import SHAPES, hf_config_for, random_checkpoint  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PROMPT_LEN = 128
MAX_CONTEXT = 1088  # prompt 128 + decode, and a 1024-token prefill
CPU_SHAPE = dict(
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    vocab_size=1024,
)
"""Overrides that shrink a published shape to a CPU-sized one of the same family (smoke and dry runs). Its
vocabulary fits the 512-token tokenizer a saved random checkpoint gets (a loader refuses a tokenizer of
fewer than half the model's tokens), and 2 ranks split its heads evenly."""
TINY_SHAPE = dict(
    num_hidden_layers=1,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    vocab_size=512,
)
"""A one-layer, 64-wide model of a published shape's family: a forward small next to the host's own work in
a step, for the benchmarks that measure that work on the CPU (host_step_bench, long_run_bench)."""


def log(*a: Any) -> None:
    print(*a, flush=True)


def comma_ints(text: str) -> list[int]:
    """``"1,8,64"`` -> [1, 8, 64]; an empty item (``"1,,8"``, ``""``) is skipped."""
    return [int(x) for x in text.split(",") if x.strip()]


# -- the floor -------------------------------------------------------------------------------------------
#
# floor = bytes the step must read from HBM ÷ the device-to-device copy bandwidth measured in the same run.
# The bytes: every weight, except that an untied input embedding contributes only the rows the step looks up
# (one per token); plus the KV bytes of the batch's contexts (every layer reads every cached token of every
# request once). A tied embedding is read whole by the lm_head, so it counts whole. Activations and the logits
# are left out: they are small next to weights and KV, and leaving them out keeps the floor a floor.

COPY_BYTES = 2 << 30  # the copy that measures bandwidth: >= 2 GiB, far past L2


def copy_bandwidth(device: torch.device, nbytes: int = COPY_BYTES) -> float:
    """Bytes/s of a large device-to-device copy, counting bytes read plus bytes written (best of 10)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    best = _best_copy_s(src, dst)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / best


def _best_copy_s(src: torch.Tensor, dst: torch.Tensor) -> float:
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize(src.device)
    return min(event_ms(lambda: dst.copy_(src)) for _ in range(10)) / 1e3


def kv_bytes_per_token(spec: Any, elem_bytes: int = 2) -> int:
    """K and V of one token across all layers."""
    return 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * elem_bytes


def decode_bytes(model: Any, contexts: Sequence[int]) -> int:
    """Bytes a decode step of ``len(contexts)`` requests with these context lengths must read."""
    spec = model.spec
    params = {id(p): p for p in model.parameters()}  # a tied lm_head is one parameter, counted once
    weights = sum(p.numel() * p.element_size() for p in params.values())
    embed = model.model.embed_tokens.weight
    if not spec.tie_word_embeddings:
        row = embed.shape[1] * embed.element_size()
        weights += len(contexts) * row - embed.numel() * embed.element_size()
    return weights + sum(contexts) * kv_bytes_per_token(spec, embed.element_size())


def floor_ms(model: Any, contexts: Sequence[int], bandwidth: float) -> float:
    return decode_bytes(model, contexts) / bandwidth * 1e3


# -- checkpoints and engines -----------------------------------------------------------------------------


def random_ckpt(shape: str, device: str = "cuda", dtype: torch.dtype = torch.bfloat16, **overrides: Any) -> Any:
    """Random weights of a published shape (models/synthetic/random_model.py), built on ``device``."""
    return random_checkpoint(hf_config_for(shape, **overrides), device=device, dtype=dtype)


def shape_ckpt(shape: str, device: str) -> Any:
    """Random weights of ``shape`` in the device's serving dtype (bf16 on CUDA, fp32 elsewhere); ``tiny``: the
    0.6B's family at ``CPU_SHAPE``'s size (smoke checks on a CPU)."""
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    if shape == "tiny":
        return random_ckpt("qwen3-0.6b", device=device, dtype=dtype, **CPU_SHAPE)
    return random_ckpt(shape, device=device, dtype=dtype)


def attention_heads(shape: str) -> tuple[int, int, bool]:
    """(query heads, KV heads, whether q and k are RMS-normed) of a published shape."""
    c = SHAPES[shape]
    return c["num_attention_heads"], c["num_key_value_heads"], c["model_type"] == "qwen3"


def projections(shape: str) -> list[tuple[str, int, int, str]]:
    """A layer's four projections of a published shape as (name, N, K, what the fused path does around
    it): q|k|v after an RMSNorm, o with the residual add, gate|up after an RMSNorm, down after SiLU·mul
    with the residual add."""
    c = SHAPES[shape]
    h, i = c["hidden_size"], c["intermediate_size"]
    hd = c.get("head_dim") or h // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    return [
        ("qkv", q + 2 * kv, h, "norm"),
        ("o", h, q, "res"),
        ("gate_up", 2 * i, h, "norm"),
        ("down", h, i, "silu_res"),
    ]


def smollm2_gguf() -> Path:
    """Where scripts/fetch_smollm2.py puts the SmolLM2 GGUF (whether or not it is there yet)."""
    spec = importlib.util.spec_from_file_location("fetch_smollm2", REPO / "scripts" / "fetch_smollm2.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.gguf_path()


def checkpoint_folder(model: str) -> Path:
    """A checkpoint folder for ``model``: the folder itself, or the one a ``.gguf`` file converts to
    (converted once, then found in the user cache)."""
    from graphtop.models.checkpoint.gguf import gguf_folder, is_gguf

    path = Path(model).expanduser()
    return gguf_folder(path) if is_gguf(path) else path


def engine_config(
    attention: str = "auto",
    graphs: bool = True,
    max_running: int = 256,
    gemv_rows: int = 1,
    decode_bs: Optional[list[int]] = None,
    prefill_graphs: bool = True,
    longest_context: int = 0,
    device: str = "cuda",
    max_context: int = MAX_CONTEXT,
    **overrides: Any,
) -> EngineConfig:
    """The benchmarks' engine settings: page size 1 unless ``page_size`` is given, graphs captured before
    the engine serves; ``decode_bs`` limits the decode graphs to those buckets and ``prefill_graphs=False``
    captures none (quicker A/B engines). The KV pool holds ``max_running`` requests of ``longest_context``
    tokens (at least 400): a batch that outgrows it runs fewer rows or preempts them mid-measurement, while
    the floor counts them all."""
    gcfg = GraphConfig()
    if not graphs:
        gcfg.set("decode.backend", "disabled")
    if not graphs or not prefill_graphs:
        gcfg.set("prefill.backend", "disabled")
    if decode_bs is not None:
        gcfg.set("decode.bs", decode_bs)
    tokens_per_request = max(400, longest_context + 8)
    settings: dict[str, Any] = dict(
        device=device,
        dtype="bfloat16" if device.startswith("cuda") else "float32",
        attention_backend=attention,
        page_size=1,
        chunked_prefill_size=1024,
        max_running_requests=max_running,
        max_context_len=max_context,
        max_total_tokens=max_running * tokens_per_request + 4096,
        graphs=gcfg,
        fused_gemv_max_rows=gemv_rows,
        capture_before_serving=True,
    )
    settings.update(overrides)
    return EngineConfig(**settings)


def make_engine(
    ckpt: Any, attention: str = "auto", graphs: bool = True, bus: Optional[EventBus] = None, **settings: Any
) -> Engine:
    """An engine over a loaded checkpoint with ``engine_config``'s settings."""
    return Engine(ckpt, engine_config(attention, graphs, **settings), bus if bus is not None else EventBus())


def fill_decode(
    eng: Engine, bs: int, seed: int = 0, prompt_len: int = PROMPT_LEN, max_new_tokens: Optional[int] = None
) -> list:
    """``bs`` greedy requests of random ``prompt_len``-token prompts, stepped until each has its first token
    (the prefills done): what follows are decode steps. They run to ``max_new_tokens`` (default: the
    benchmark context's room) or until cancelled."""
    g = torch.Generator().manual_seed(seed)
    vocab = eng.spec.vocab_size
    new = max_new_tokens if max_new_tokens is not None else MAX_CONTEXT - prompt_len - 2
    params = SamplingParams(max_new_tokens=new, ignore_eos=True, detokenize=False)
    handles = [
        eng.submit(torch.randint(10, vocab - 10, (prompt_len,), generator=g).tolist(), params) for _ in range(bs)
    ]
    prefill_all(eng, handles)
    return handles


def prefill_all(eng: Engine, handles: list) -> None:
    """Step until each of ``handles`` has its first token, prefill first: the scheduler's turns of prefill
    and decode are off meanwhile, so no row decodes while another still prefills, and every row enters
    decode with one token (the same context, which the benchmarks' KV pools are sized for)."""
    scheduler = eng.scheduler
    saved, scheduler.interleave = scheduler.interleave, False
    try:
        while any(len(h._token_ids) == 0 for h in handles):
            eng.step()
    finally:
        scheduler.interleave = saved


def drain(eng: Engine, handles: list) -> None:
    """Cancel the requests and step until the engine is idle; the KV pool must be empty after."""
    for h in handles:
        eng.cancel(h.request_id)
    eng.run_until_idle()
    assert eng.pool.used_pages == 0, "KV pool not empty after drain"


def refuse_past_context(ap: argparse.ArgumentParser, context: int, what: str) -> None:
    """Stop the run (one line, exit 2) where a request would outgrow the benchmark's context."""
    if context > MAX_CONTEXT - 2:
        ap.error(f"{what} reach {context} tokens of context, past the benchmark's {MAX_CONTEXT - 2}")


def release_cuda() -> None:
    """Hand freed device memory back between engines, so the next one plans its pool on what is free."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


# -- timing ------------------------------------------------------------------------------------------------


def sync_for(device: str) -> Callable[[], None]:
    """What waits for the device's queued work: ``torch.cuda.synchronize`` on CUDA, nothing on the CPU."""
    return torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)


def time_steps(eng: Engine, n: int, sync: Optional[Callable[[], None]] = None) -> float:
    """Ms a whole serving step (schedule, forward, sample, events), over ``n`` steps with one synchronize at
    each end; each step's own read-back of its tokens is part of it, as in serving."""
    sync = sync or torch.cuda.synchronize
    sync()
    t = time.perf_counter()
    for _ in range(n):
        eng.step()
    sync()
    return (time.perf_counter() - t) / n * 1e3


EVENTS_PROMPT = 32


def events_overhead(engine: Any, bs: int, steps: int, rounds: int, sync: Callable[[], None]) -> dict[str, float]:
    """Median step ms with a trace recorder subscribed (``on_ms``) and without (``off_ms``), in rounds that
    alternate off, on; each measurement prefills ``bs`` fresh requests (untimed), times ``steps`` decode
    steps and serves the rest, so every measurement covers the same contexts."""

    def measure() -> float:
        fill_decode(engine, bs, prompt_len=EVENTS_PROMPT, max_new_tokens=steps + 2)
        ms = time_steps(engine, steps, sync)
        engine.run_until_idle()
        return ms

    measure()  # warm-up
    off, on = [], []
    for _ in range(rounds):
        off.append(measure())
        with tempfile.TemporaryDirectory(prefix="gt-events-") as tmp:
            rec = TraceRecorder(str(Path(tmp) / "trace.jsonl"), engine.bus, header_meta={"bench": "events"})
            try:
                on.append(measure())
            finally:
                rec.close()
    off_ms, on_ms = statistics.median(off), statistics.median(on)
    return {"off_ms": off_ms, "on_ms": on_ms, "ratio": on_ms / off_ms}


def event_ms(fn: Callable[[], Any], reps: int = 1) -> float:
    """Ms of ``reps`` calls of ``fn`` on the current stream, between two CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def graph_us(fn: Callable[[int], Any], layers: int, replays: int = 1, samples: int = 7, best: bool = False) -> float:
    """µs per layer of a CUDA graph that runs ``fn(layer)`` for every layer, timed by replay so launch gaps
    count. Each layer should own its weights or cache, so they stream from HBM and not from L2. A sample
    is ``replays`` replays between CUDA events; the figure is the median of ``samples`` (the minimum with
    ``best``). ``fn`` runs once per layer on a side stream first (compilation, autotuning, workspaces)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for layer in range(layers):
            fn(layer)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for layer in range(layers):
            fn(layer)
    for _ in range(3):
        graph.replay()
    times = [event_ms(graph.replay, replays) * 1e3 / replays / layers for _ in range(samples)]
    del graph
    return min(times) if best else statistics.median(times)


T = TypeVar("T")


def interleaved(
    contestants: dict[str, Callable[[], T]],
    rounds: int,
    abba: bool = False,
    on_round: Optional[Callable[[int, dict[str, list[T]]], None]] = None,
) -> dict[str, list[T]]:
    """Every contestant's figure for each of ``rounds`` rounds, the contestants taking turns within a round
    (with ``abba`` the order reverses every other round), so clock drift, context growth and other load on
    the machine hit all of them alike. ``on_round(r, figures)`` runs after each round (progress lines)."""
    figures: dict[str, list[T]] = {name: [] for name in contestants}
    for r in range(rounds):
        order = list(contestants)
        if abba and r % 2:
            order.reverse()
        for name in order:
            figures[name].append(contestants[name]())
        if on_round is not None:
            on_round(r, figures)
    return figures


def medians(figures: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(values) for name, values in figures.items()}


def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """The ``q``-th percentile (0-100) of ``values``, interpolated between the two nearest; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


# -- output ------------------------------------------------------------------------------------------------


def fmt(v: Optional[float], spec: str = ".3f") -> str:
    """A figure, or an en dash where there is none."""
    return "–" if v is None else format(v, spec)


def ratio(a: Optional[float], b: Optional[float]) -> str:
    """``a ÷ b`` as ``1.23×``, or an en dash where either is missing or ``b`` is 0."""
    return "–" if a is None or b is None or b == 0 else f"{a / b:.2f}×"


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (the form docs/benchmarks.md quotes)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_text(out_dir: str | Path, name: str, text: str) -> Path:
    """``text`` in ``out_dir/name``, the folder made if missing; the path written."""
    path = Path(out_dir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def write_json(out_dir: str | Path, name: str, data: Any) -> Path:
    """``data`` as indented JSON in ``out_dir/name`` (the folder made if missing); the path written."""
    return write_text(out_dir, name, json.dumps(data, indent=1) + "\n")
