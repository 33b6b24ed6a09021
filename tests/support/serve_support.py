"""Shared pieces of the HTTP API tests: a small CPU engine serving on an ephemeral port of 127.0.0.1, the
official ``openai`` client pointed at it, and waits with bounded timeouts (a helper module, not a conftest).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch

from graphtop.engine.config import EngineConfig
from graphtop.engine.engine import Engine
from graphtop.engine.graphs.config import GraphConfig
from graphtop.engine.sampling_params import SamplingParams
from graphtop.engine.telemetry.bus import EventBus
from graphtop.engine.telemetry.metrics import MetricsCollector
from graphtop.engine.telemetry.recorder import TraceRecorder
from graphtop.server.options import ServeOptions
from graphtop.server.server import ApiServer
from support.waiting import wait_for

MODEL_NAME = "demo"
TIMEOUT_S = 60.0


def small_config(**overrides: Any) -> EngineConfig:
    """A CPU fp32 engine with few buckets (cheap emulated capture, captured before serving)."""
    graphs = overrides.pop("graphs", None) or GraphConfig(decode_bs=[1, 2, 4, 8], prefill_num_tokens=[16, 32, 64])
    kwargs: dict[str, Any] = dict(
        device="cpu",
        dtype="float32",
        max_total_tokens=4096,
        max_running_requests=8,
        chunked_prefill_size=64,
        capture_before_serving=True,
    )
    kwargs.update(overrides)
    return EngineConfig(graphs=graphs, **kwargs)


@dataclass
class Served:
    engine: Engine
    server: ApiServer
    bus: EventBus
    metrics: MetricsCollector
    recorder: Optional[TraceRecorder]

    @property
    def url(self) -> str:
        return self.server.url

    def client(self, api_key: str = "unused") -> Any:
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, timeout=TIMEOUT_S)

    def greedy(self, prompt: Any, max_tokens: int, *, chat: bool = False, **params: Any) -> Any:
        """The engine's own greedy answer (Python API, same engine), as a finished handle."""
        handle = self.engine.submit(
            prompt, SamplingParams(max_new_tokens=max_tokens, temperature=0.0, **params), chat=chat
        )
        assert handle.wait(TIMEOUT_S), "the engine did not finish a reference request"
        return handle


@contextmanager
def serving(
    model: Optional[Path], *, options: Optional[ServeOptions] = None, record: Optional[Path] = None, **config: Any
) -> Iterator[Served]:
    """An engine on its background thread behind an ApiServer on 127.0.0.1:0. The metrics collector (and
    the recorder, with ``record``) subscribe before the engine is built, as ``graphtop serve`` does."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model gains nothing from more; a shared 2-core machine loses
    bus = EventBus()
    metrics = MetricsCollector(bus)
    recorder = TraceRecorder(record, bus, header_meta={"workload": "test"}) if record is not None else None
    engine = server = None
    try:
        engine = Engine.from_pretrained(model, config=small_config(**config), bus=bus)
        engine.start_background()
        server = ApiServer(engine, options or ServeOptions(port=0, model_name=MODEL_NAME), metrics=metrics).start()
        yield Served(engine, server, bus, metrics, recorder)
    finally:
        if server is not None:
            server.close()
        if engine is not None:
            engine.close()
        metrics.close()
        if recorder is not None:
            recorder.close()
        torch.set_num_threads(threads)


def wait_until(condition: Callable[[], bool], timeout: float = TIMEOUT_S, what: str = "the condition") -> None:
    """``wait_for`` with the serve tests' bound."""
    wait_for(condition, timeout, what)


def engine_idle(engine: Engine) -> bool:
    """No request running or waiting, and no KV page held (read from the test thread: a snapshot)."""
    s = engine.scheduler
    return not s.running and not s.waiting and engine.pool.used_pages == 0
