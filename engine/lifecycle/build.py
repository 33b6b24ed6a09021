"""The parts an ``Engine`` is made of, built in order from a loaded checkpoint and its config.

``build_parts`` is the engine's constructor body: it sizes the KV pool from the memory plan, picks the
attention backend and the model's kernels, resolves the graph config, builds the model runner (this
rank's, or the tensor-parallel group's), announces the engine, starts the graph capture, and wires the
step loop's parts to each other. Each part gets the parts it calls; none gets the engine, which owns
them all and delegates its public methods to them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from graphtop.models.layers.moe import expert_weight_bytes

from ..api.controls import Controls
from ..api.requests import Requests
from ..attention.base import AttentionShape
from ..attention.select import select_attention_backend
from ..config import EngineConfig, context_limit
from ..distributed.group import TensorParallelGroup
from ..distributed.setup import RankSetup
from ..errors import EngineError
from ..graphs.config import resolve_graph_config
from ..graphs.model_runner import ModelRunner
from ..kernel_config import KernelConfig, resolve_kernel_config
from ..kv_pool import KVLayout, KVPool
from ..memory_plan import MemoryPlan, MiB, check_graph_buffers_fit, graph_reserve_estimate, plan_kv_pool
from ..parity.checker import ParityChecker
from ..parity.scratch import scratch_pages
from ..prompts import PromptByteLimit
from ..scheduler import Scheduler, SchedulerConfig
from ..step.apply import CommandApplier
from ..step.commands import CommandQueue
from ..step.events import EngineEvents
from ..step.in_flight import RequestsInFlight
from ..step.loop import StepLoop
from ..step.output import OutputProcessor
from ..step.overlap import TokenReadback
from ..step.serving import Serving
from ..telemetry.bus import EventBus
from .info import EngineInfo, describe, started_events
from .kernel_cache import kernel_precompile


@dataclass
class EngineParts:
    """Everything an engine holds; ``Engine`` exposes each as an attribute of the same name."""

    tp: Optional[TensorParallelGroup]
    config: EngineConfig
    bus: EventBus
    checkpoint: Any
    model: Any
    tokenizer: Any
    spec: Any
    device: torch.device
    dtype: torch.dtype
    demo: bool
    kernels: KernelConfig
    max_context_len: int
    prompt_limit: PromptByteLimit
    memory_plan: MemoryPlan
    pool: KVPool
    max_running: int
    attention: Any
    scheduler: Scheduler
    model_runner: ModelRunner
    events: EngineEvents
    parity: ParityChecker
    info: EngineInfo
    commands: CommandQueue
    in_flight: RequestsInFlight
    output: OutputProcessor
    loop: StepLoop
    serving: Serving
    requests: Requests
    controls: Controls


def build_parts(
    checkpoint: Any, config: EngineConfig, bus: EventBus, demo: bool, tp: Optional[TensorParallelGroup]
) -> EngineParts:
    """The parts of an engine for ``checkpoint`` (rank 0's shard with ``tp``); the graph capture has
    started (and finished, with ``capture_before_serving``) when it returns."""
    model, tokenizer, spec = checkpoint.model, checkpoint.tokenizer, checkpoint.spec
    if config.chat_template is not None:  # before anything reads it (telemetry says whether chat works)
        tokenizer.chat_template = config.chat_template
    device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
    kernels = resolve_kernel_config(config.kernels)
    max_context_len = context_limit(config.max_context_len, spec.max_position_embeddings)
    prompt_limit = PromptByteLimit(tokenizer, max_context_len)  # too long by its bytes alone
    local = model.spec  # this rank's heads and KV heads (the whole model's without tensor parallelism)
    layout = KVLayout(local.num_layers, local.num_kv_heads, local.head_dim, dtype)
    plan_inputs = dict(
        bytes_per_token=layout.bytes_per_token,
        page_size=config.page_size,
        mem_fraction_static=config.mem_fraction_static,
        cpu_kv_budget_bytes=config.cpu_kv_budget_mb * MiB,
        activation_reserve_bytes=config.activation_reserve_mb * MiB,
        graph_reserve_bytes=graph_reserve_estimate(device),
        max_total_tokens=config.max_total_tokens,
    )
    # a packed skinny GEMM's weight copies come on top of the checkpoint's bytes (KernelConfig)
    copies = model.packed_copy_bytes() if kernels.skinny_packed else 0
    memory_plan = plan_kv_pool(device=device, weights_bytes=checkpoint.weights_bytes + copies, **plan_inputs)
    if tp is not None:
        memory_plan = tp.plan_kv_pool(plan_inputs, memory_plan)
    pool = KVPool(layout, memory_plan.num_pages, config.page_size, device)
    max_running = min(config.max_running_requests or 256, pool.capacity_pages)
    attention, attention_note = select_attention_backend(
        config.attention_backend, pool, AttentionShape.of(local), device, kernels
    )
    attention_note += enable_model_kernels(model, config, kernels)
    if config.overlap_schedule:
        attention_note += " · overlap schedule"
    scheduler = Scheduler(pool, SchedulerConfig(config.chunked_prefill_size, max_running, spec.kv_window))
    resolved = resolve_graph_config(
        config.graphs,
        max_running=max_running,
        pool_tokens=pool.capacity_tokens,
        chunked_prefill_size=config.chunked_prefill_size,
        cuda_graphs_available=device.type == "cuda",
        attention_supports_decode_graph=attention.supports_decode_graph,
    )
    max_pages = pool.pages_for(max_context_len)
    if resolved.available:  # static buffers that would not fit: refused before allocating them
        check_graph_buffers_fit(
            local,
            dtype,
            device,
            max(resolved.decode_bs, default=0),
            max_pages,
            max(resolved.prefill_num_tokens, default=0),
        )
    runner_args = (model, attention, device, resolved, max_pages, bus.publish)
    if tp is None:
        setup = f"{local!r}|{dtype}|{kernels!r}|{attention_note}|{config.page_size}|{max_pages}"
        ahead = kernel_precompile(kernels, device, config.tp_size, config.cache_dir, setup)
        model_runner = ModelRunner(
            *runner_args,
            freeze_gc=config.graphs.freeze_gc,
            precompile=ahead,
            record_in_flight=config.graphs.record_in_flight,
        )
    else:
        rank_setup = RankSetup(
            attention.name,
            kernels,
            config.fused_kernels,
            config.fused_gemv_max_rows,
            resolved,
            max_pages,
            config.graphs.freeze_gc,
        )
        model_runner = tp.model_runner(*runner_args, freeze_gc=config.graphs.freeze_gc, setup=rank_setup)
    events = EngineEvents(
        bus, device, scheduler, pool, memory_plan, model_runner, max_running, expert_bytes=expert_weight_bytes(model)
    )
    parity = ParityChecker(
        model,
        attention,
        pool,
        device,
        bus.publish,
        scratch_pages=scratch_pages(model_runner, pool, max_running),
        tolerance=config.parity_tolerance,
    )
    info = describe(
        checkpoint, attention_note, attention, model_runner, pool, max_running, max_context_len, demo, config.tp_size
    )
    for event in started_events(info, model_runner.resolved):
        bus.publish(event)
    if config.parity_every and tp is not None:
        raise EngineError("parity checks do not run with tensor parallelism (--tp > 1)")
    model_runner.start_capture()
    if config.capture_before_serving:
        model_runner.advance_capture(to_the_end=True)
    if config.parity_every:  # before anything reads the pool's capacity: scratch comes out of it
        problem = parity.set_every(config.parity_every)
        if problem:
            raise EngineError(problem)
    events.memory_ledger()
    events.kv(force=True)

    commands = CommandQueue()
    in_flight = RequestsInFlight(scheduler)
    output = OutputProcessor(
        tokenizer, frozenset(spec.eos_token_ids), max_context_len, pool.capacity_tokens, in_flight, bus.publish
    )
    loop = StepLoop(
        scheduler,
        pool,
        model_runner,
        output,
        events,
        commands,
        CommandApplier(in_flight, output, pool, model_runner, parity, events, bus),
        TokenReadback(device, max_running),
        max_context_len,
        config.overlap_schedule,
        parity,
    )
    serving = Serving(
        tp, device, bus, attention, pool, scheduler, model_runner, parity, output, loop, commands, in_flight
    )
    requests = Requests(tokenizer, spec, bus, pool, commands, max_context_len, prompt_limit, in_flight, serving)
    controls = Controls(tp, bus, commands, parity, serving)
    return EngineParts(
        tp, config, bus, checkpoint, model, tokenizer, spec, device, dtype, demo, kernels, max_context_len,
        prompt_limit, memory_plan, pool, max_running, attention, scheduler, model_runner, events, parity, info,
        commands, in_flight, output, loop, serving, requests, controls,
    )  # fmt: skip


def enable_model_kernels(model: Any, config: EngineConfig, kernels: KernelConfig) -> str:
    """Switch the model to its fused kernels where the device allows; the note says what happened."""
    k = kernels
    if not (
        config.fused_kernels
        and model.enable_fused_kernels(
            config.fused_gemv_max_rows,
            gemv=k.gemv_layers,
            pdl=k.pdl,
            skinny=k.skinny_layers,
            packed=k.skinny_packed,
            fused_mlp=k.fused_mlp,
        )
    ):
        return ""
    note = " · model kernels: triton-fused"
    if model.fused_gemv_rows:
        note += f" (fused-GEMV layers for steps of <= {model.fused_gemv_rows} tokens)"
    if model.fused_mlp_layers():
        note += " · fused MLP: one launch a layer"
    elif k.mlp_fused:  # asked for by name: say that it did not take effect
        note += " · fused MLP: not for this model"
    if k.skinny_packed:  # asked for: say where it took effect, and what it holds
        rows = model.packed_rows()
        note += (
            f" · packed skinny weights for steps of {', '.join(f'{a}-{b}' for a, b in rows)} tokens"
            f" ({model.packed_bytes() / 2**30:.1f} GiB)"
            if rows
            else " · packed skinny weights: none for this shape"
        )
    return note
