"""The engine in this process: :class:`EngineSession` loads it in a worker thread and serves it.

``graphtop`` itself runs the engine in another process and attaches (``remote``); this session is for
Pilot tests and benchmarks that want the engine and the dashboard in one process, with the engine's
log records kept off the terminal the dashboard draws on (``LogCapture``).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import TYPE_CHECKING, Any, Optional

from graphtop.engine.gc_freeze import freeze_heap, thaw_heap

from .base import Limits, SamplingSettings, StreamHandle
from .prompt_queue import PromptQueue

if TYPE_CHECKING:  # typing only: importing the engine package pulls in torch
    from graphtop.engine.telemetry.events import Event


class LogCapture(logging.Handler):
    """Keeps the engine's log records for the dashboard instead of letting them hit the terminal.

    While the TUI owns the screen, a log line written to stderr would tear the display; the app
    drains these on its timer and shows warnings as notifications.
    """

    def __init__(self, maxlen: int = 200) -> None:
        super().__init__(logging.INFO)
        self.records: deque[tuple[int, str]] = deque(maxlen=maxlen)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.records.append((record.levelno, record.getMessage()))
        except Exception:  # pragma: no cover - never let logging break the engine
            pass

    def drain(self) -> list[tuple[int, str]]:
        out = []
        while self.records:
            out.append(self.records.popleft())
        return out


class EngineSession:
    """A live :class:`graphtop.engine.Engine`, loaded in a worker thread.

    The bus and subscription are created inside ``start`` (in the worker) because importing the
    engine pulls in torch, which would otherwise delay the first frame by seconds. Until then
    ``drain`` simply returns nothing and ``submit`` holds prompts. The engine serves as soon as the
    model is loaded: graphs are captured between steps (``EngineConfig.capture_before_serving``).
    """

    kind = "live"
    replay = None
    hosts_engine = True
    detaches = False
    ended = None
    silent_for = None  # the engine is in this process: it cannot go silent without the dashboard

    def __init__(
        self,
        model_path: Optional[str],
        engine_config: Any = None,
        *,
        queue_size: int = 50_000,
        engine_factory: Any = None,
    ) -> None:
        self.model_path = model_path
        self.engine_config = engine_config
        self.queue_size = queue_size
        self.label = model_path or "demo model"
        self._engine_factory = engine_factory
        self._sub: Any = None
        self._bus: Any = None
        self.engine: Any = None
        self._closed = threading.Event()
        self.logs = LogCapture()
        self._logger = logging.getLogger("graphtop")
        self._propagate = self._logger.propagate
        self.prompts = PromptQueue()
        self._thaw = False  # this session froze the heap and thaws it at shutdown

    def start(self) -> None:
        """Load the model (blocking), start the serve loop (it captures graphs between steps), and
        send the prompts typed meanwhile."""
        self._logger.addHandler(self.logs)
        self._logger.propagate = False  # keep engine logs off the terminal the TUI is drawing on
        from graphtop.engine.telemetry.bus import EventBus

        self._bus = EventBus()
        self._sub = self._bus.subscribe("tui", maxsize=self.queue_size)
        try:
            engine = self._load()
        except BaseException as exc:
            self.prompts.fail(f"the engine failed to start: {type(exc).__name__}: {exc}")
            raise
        if self._closed.is_set():  # the app quit while we were loading
            engine.shutdown()
            return
        self.engine = engine
        self._thaw = freeze_heap()  # the loaded heap out of the collector's way while it serves (engine/gc_freeze.py)
        engine.start_background()
        self.prompts.release(self._submit_now)

    def _load(self) -> Any:
        factory = self._engine_factory
        if factory is None:
            from graphtop.engine import Engine, EngineConfig

            config = self.engine_config if self.engine_config is not None else EngineConfig()
            return Engine.from_pretrained(self.model_path, config=config, bus=self._bus)
        return factory(self.model_path, self.engine_config, self._bus)

    def drain(self, max_items: Optional[int] = None) -> list[Event]:
        sub = self._sub
        return sub.drain(max_items) if sub is not None else []

    @property
    def dropped(self) -> int:
        sub = self._sub
        return sub.dropped if sub is not None else 0

    @property
    def can_submit(self) -> bool:
        return self.engine is not None

    @property
    def chat_available(self) -> bool:
        tok = getattr(self.engine, "tokenizer", None)
        return bool(getattr(tok, "chat_template", None))

    def submit(self, prompt: str, settings: SamplingSettings, chat: bool) -> StreamHandle:
        return self.prompts.submit(prompt, settings, chat)

    def _submit_now(self, prompt: str, settings: SamplingSettings, chat: bool) -> StreamHandle:
        return self.engine.submit(prompt, settings.to_params(), chat=chat and self.chat_available)

    def recapture(self, decode_bs: Optional[list[int]], prefill_num_tokens: Optional[list[int]]) -> None:
        if self.engine is None:
            raise RuntimeError("the engine is still loading")
        self.engine.recapture(decode_bs=decode_bs, prefill_num_tokens=prefill_num_tokens)

    def buckets(self) -> tuple[Optional[list[int]], Optional[list[int]]]:
        if self.engine is None:
            return None, None
        return list(self.engine.decode_buckets), list(self.engine.prefill_buckets)

    def limits(self) -> Limits:
        info = getattr(self.engine, "info", None)
        if info is None:
            return Limits()
        return Limits(info.max_running, info.kv_capacity_tokens)

    @property
    def parity_every(self) -> int:
        """Graph steps per parity check (0: off): the engine's, or the config's before it loads."""
        if self.engine is not None:
            return int(self.engine.parity_every)
        return int(getattr(self.engine_config, "parity_every", 0) or 0)

    def set_parity_every(self, every: int) -> None:
        if self.engine is None:
            raise RuntimeError("the engine is still loading")
        self.engine.set_parity_every(every)

    def drain_logs(self) -> list[tuple[int, str]]:
        """Engine log records (level, message) since the last call."""
        return self.logs.drain()

    def shutdown(self) -> None:
        self._closed.set()
        self.prompts.fail("the dashboard is closing")
        if self.logs in self._logger.handlers:
            self._logger.removeHandler(self.logs)
            self._logger.propagate = self._propagate
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
        thaw_heap(self._thaw)
        self._thaw = False
        if self._bus is not None and self._sub is not None:
            self._bus.unsubscribe(self._sub)
