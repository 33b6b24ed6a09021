"""What the engine says it is: ``EngineInfo``, and the events that announce a started engine."""

from __future__ import annotations

from dataclasses import dataclass

from .graphs.config import ResolvedGraphConfig
from .telemetry import events as ev


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
            model=info.model, architecture=info.architecture, device=info.device, device_name=info.device_name,
            dtype=info.dtype, attention_backend=info.attention_backend,
            attention_backend_note=info.attention_backend_note, decode_graph_backend=info.decode_graph_backend,
            prefill_graph_backend=info.prefill_graph_backend, emulated=info.emulated,
            graph_config=resolved.as_dict(), locked_keys=tuple(sorted(resolved.locked)), demo=info.demo,
            tp_size=info.tp_size,
        )
    ]
    out.extend(ev.ConfigDowngrade(key=d.key, old=d.old, new=d.new, reason=d.reason) for d in resolved.downgrades)
    return out
