"""What the engine says it is: ``EngineInfo``, and the events that announce a started engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..device import device_name
from ..graphs.config import ResolvedGraphConfig
from ..telemetry import events as ev


@dataclass(frozen=True)
class EngineInfo:
    model: str
    architecture: str
    device: str
    device_name: str
    dtype: str
    attention_backend: str
    attention_backend_note: str
    decode_graph_backend: str
    prefill_graph_backend: str
    emulated: bool
    kv_capacity_tokens: int
    max_running: int
    max_context_len: int
    page_size: int
    demo: bool
    tp_size: int = 1


def started_events(info: EngineInfo, resolved: ResolvedGraphConfig) -> list[ev.Event]:
    """``EngineStarted`` (what runs, with the resolved graph config), then one ``ConfigDowngrade`` per
    automatic change to the user's graph config: what the engine publishes when it starts, and what a
    viewer attaching later gets first (telemetry_link.py)."""
    out: list[ev.Event] = [
        ev.EngineStarted(
            model=info.model,
            architecture=info.architecture,
            device=info.device,
            device_name=info.device_name,
            dtype=info.dtype,
            attention_backend=info.attention_backend,
            attention_backend_note=info.attention_backend_note,
            decode_graph_backend=info.decode_graph_backend,
            prefill_graph_backend=info.prefill_graph_backend,
            emulated=info.emulated,
            graph_config=resolved.as_dict(),
            locked_keys=tuple(sorted(resolved.locked)),
            demo=info.demo,
            tp_size=info.tp_size,
        )
    ]
    out.extend(ev.ConfigDowngrade(key=d.key, old=d.old, new=d.new, reason=d.reason) for d in resolved.downgrades)
    return out


def describe(
    checkpoint: Any,
    attention_note: str,
    attention: Any,
    model_runner: Any,
    pool: Any,
    max_running: int,
    max_context_len: int,
    demo: bool,
    tp_size: int,
) -> EngineInfo:
    """The engine's ``info``, from the parts it was built from."""
    model = checkpoint.model
    param = next(model.parameters())
    return EngineInfo(
        model=str(checkpoint.path),
        architecture=checkpoint.spec.architecture,
        device=str(param.device),
        device_name=device_name(param.device),
        dtype=str(param.dtype).replace("torch.", ""),
        attention_backend=attention.describe(),
        attention_backend_note=attention_note,
        decode_graph_backend=model_runner.decode_backend_label,
        prefill_graph_backend=model_runner.prefill_backend_label,
        emulated=model_runner.emulated,
        kv_capacity_tokens=pool.capacity_tokens,
        max_running=max_running,
        max_context_len=max_context_len,
        page_size=pool.page_size,
        demo=demo,
        tp_size=tp_size,
    )
