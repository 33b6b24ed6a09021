"""The engine behind a telemetry endpoint: what ``Engine.serve_telemetry`` wires together.

``EngineLink`` turns the endpoint's typed commands into the calls of the engine's parts that the public
methods delegate to (each only queues work for the engine thread), so the endpoint package needs
neither torch nor the engine, and nothing here calls back into the ``Engine``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

from ..api.controls import Controls
from ..api.requests import Requests
from ..graphs.model_runner import ModelRunner
from ..step.events import EngineEvents
from ..telemetry import events as ev
from ..telemetry.protocol import EngineStatus, Sampling
from ..telemetry.server import EndpointConfig, TelemetryServer
from .info import EngineInfo, started_events

if TYPE_CHECKING:
    from ..request import RequestHandle


class EngineLink:
    def __init__(
        self,
        info: EngineInfo,
        tokenizer: Any,
        model_runner: ModelRunner,
        events: EngineEvents,
        requests: Requests,
        controls: Controls,
    ) -> None:
        """The engine's parts a viewer reaches: what it is, its graphs, its events, its requests and its
        controls."""
        self.info = info
        self.tokenizer = tokenizer
        self.model_runner = model_runner
        self.events = events
        self.requests = requests
        self.controls = controls

    def status(self) -> EngineStatus:
        info = self.info
        return EngineStatus(
            ready=True,
            model=info.model,
            device=f"{info.device} {info.device_name}".strip(),
            chat=bool(getattr(self.tokenizer, "chat_template", None)),
            max_running=info.max_running,
            kv_capacity_tokens=info.kv_capacity_tokens,
            parity_every=self.controls.parity_every,
        )

    def state_events(self) -> list[ev.Event]:
        info = self.info
        out: list[ev.Event] = started_events(info, self.model_runner.resolved)
        by_phase: dict[str, list] = {}
        for rec in self.model_runner.capture_ledger():
            by_phase.setdefault(rec.phase, []).append(rec)
        backends = {"decode": info.decode_graph_backend, "prefill": info.prefill_graph_backend}
        for phase, recs in by_phase.items():
            out.append(ev.CaptureStarted(phase=phase, buckets=tuple(r.bucket for r in recs), backend=backends[phase]))
            out += [
                ev.CaptureProgress(
                    phase=phase,
                    bucket=r.bucket,
                    index=i,
                    total=len(recs),
                    seconds=r.seconds,
                    memory_bytes=r.memory_bytes,
                    ok=r.ok,
                    failure_reason=r.failure_reason,
                )
                for i, r in enumerate(recs, 1)
            ]
            failed = tuple(r.bucket for r in recs if not r.ok)
            out.append(
                ev.CaptureFinished(
                    phase=phase,
                    captured=tuple(r.bucket for r in recs if r.ok),
                    failed=failed,
                    seconds=sum(r.seconds for r in recs),
                    memory_bytes=sum(r.memory_bytes for r in recs if r.ok),
                    ok=not failed,
                )
            )
        out += [self.events.ledger(), self.events.kv_state()]
        return out

    def submit(self, request_id: str, prompt: str, sampling: Sampling, chat: bool) -> "RequestHandle":
        return self.requests.submit(prompt, sampling.to_params(), chat=chat, request_id=request_id)

    def cancel(self, request_id: str) -> None:
        self.requests.cancel(request_id)

    def recapture(self, decode_bs: Optional[list[int]], prefill_num_tokens: Optional[list[int]]) -> None:
        self.controls.recapture(decode_bs=decode_bs, prefill_num_tokens=prefill_num_tokens)

    def set_parity_every(self, every: int) -> None:
        self.controls.set_parity_every(every)


def serve_telemetry(
    link: EngineLink,
    bus: Any,
    address: str = "ipc",
    *,
    runtime_dir: Union[str, Path, None] = None,
    server: Optional[TelemetryServer] = None,
) -> TelemetryServer:
    """Attach ``link`` to ``server`` (or to a new endpoint on ``bus``, the engine's) and return it."""
    if server is None:
        server = TelemetryServer(
            bus,
            EndpointConfig(
                address=address,
                runtime_dir=Path(runtime_dir) if runtime_dir is not None else None,
                label=link.info.model,
            ),
        )
    server.attach_engine(link)
    return server
