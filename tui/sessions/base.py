"""The one seam between the dashboard and the engine.

The app talks only to a :class:`Session`: ``RemoteSession`` attaches to an engine's telemetry endpoint
(``graphtop``, ``graphtop attach``), :class:`EngineSession` runs the engine in this process (Pilot
tests, benchmarks), tests use ``FakeSession`` (scripted events) and ``graphtop --replay`` uses
``ReplaySession``. Keeping the
engine behind this adapter is what lets the whole dashboard be tested without a GPU or a model.

Threading contract: ``start`` is blocking and runs in a textual thread worker; ``drain``,
``submit``, ``recapture`` are called from the UI thread and never block (the engine's own calls
are thread-safe and return at once). ``submit`` works from the first frame: a prompt typed while
the model loads is held (``prompt_queue``) and sent once the engine is ready.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Protocol

from .prompt_queue import PromptQueue

if TYPE_CHECKING:  # typing only: importing the engine package pulls in torch
    from graphtop.engine import SamplingParams
    from graphtop.engine.telemetry.events import Event


class SessionError(RuntimeError):
    """``Session.start`` failed for a reason whose message says it all (e.g. the engine's own error,
    forwarded from another process): shown as is, without the exception's type name."""


@dataclass(frozen=True)
class SamplingSettings:
    """What the console's settings row edits; mirrors the engine's SamplingParams."""

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: Optional[int] = None

    def to_params(self) -> "SamplingParams":
        """The engine's SamplingParams for these settings: ValueError (one line) where the engine's own
        rules refuse them. The one home of those rules, so a prompt typed while the model loads is
        refused as it is typed, not later when the engine takes it."""
        from graphtop.engine import SamplingParams

        return SamplingParams(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_k=self.top_k,
                              top_p=self.top_p, seed=self.seed)

    def describe(self) -> str:
        seed = "—" if self.seed is None else str(self.seed)
        return (
            f"max {self.max_new_tokens} · T {self.temperature:g} · top-p {self.top_p:g} · "
            f"top-k {self.top_k} · seed {seed}"
        )


class StreamHandle(Protocol):
    """The slice of the engine's RequestHandle the console needs."""

    request_id: Any
    finished: bool
    finish_reason: Optional[str]
    error: Optional[str]

    def new_text(self) -> str:
        """Text generated since the last call (thread-safe on the engine side)."""
        ...


@dataclass(frozen=True)
class Limits:
    """Bounds the bucket editor validates against; None when the engine did not say."""

    max_running: Optional[int] = None
    kv_capacity_tokens: Optional[int] = None


class ReplayControls(Protocol):
    """Playback of a recorded trace: what the replay bar shows and the seek keys drive."""

    paused: bool
    speed: float
    path: Optional[str]  # the trace file it plays, if it came from one

    @property
    def position(self) -> float: ...
    @property
    def duration(self) -> float: ...
    @property
    def cursor(self) -> int: ...
    @property
    def total(self) -> int: ...
    @property
    def finished(self) -> bool: ...
    def toggle_pause(self) -> bool: ...
    def change_speed(self, direction: int) -> float: ...
    def seek(self, seconds: float) -> None: ...
    def seek_to(self, position: float) -> None: ...
    def seek_events(self, n: int) -> None: ...
    def take_reset(self) -> bool:
        """True once after a backwards seek: the app must start from an empty state."""
        ...


class Session(Protocol):
    """Where the dashboard's events and requests come from.

    ``replay`` is None except for a recorded trace; ``hosts_engine`` says the engine runs in this
    process (the app then shortens the GIL switch interval for it); ``detaches`` says ``q`` leaves a
    running engine behind (a viewer attached to an endpoint); ``ended`` says why a live engine is
    gone (None while it runs); ``silent_for`` is how long an engine that should be talking has said
    nothing, once that is past the stale threshold (None while it talks, or when it cannot go silent).
    """

    kind: str  # "live" | "replay"
    label: str
    replay: Optional[ReplayControls]
    hosts_engine: bool
    detaches: bool

    def start(self) -> None: ...
    def drain(self, max_items: Optional[int] = None) -> list[Event]: ...
    @property
    def dropped(self) -> int: ...
    @property
    def can_submit(self) -> bool:
        """The engine is ready (a recapture needs it; prompts are held by ``submit`` until then)."""
        ...
    @property
    def chat_available(self) -> bool: ...
    @property
    def ended(self) -> Optional[str]: ...
    @property
    def silent_for(self) -> Optional[float]: ...
    def submit(self, prompt: str, settings: SamplingSettings, chat: bool) -> StreamHandle:
        """Run ``prompt`` (``chat``: through the chat template, when the tokenizer has one). Before the
        engine is ready the prompt is held and sent once it is; raises only when it never will be."""
        ...
    def recapture(self, decode_bs: Optional[list[int]], prefill_num_tokens: Optional[list[int]]) -> None: ...
    def buckets(self) -> tuple[Optional[list[int]], Optional[list[int]]]: ...
    def limits(self) -> Limits: ...
    @property
    def parity_every(self) -> int: ...
    def set_parity_every(self, every: int) -> None: ...
    def drain_logs(self) -> list[tuple[int, str]]:
        """Engine log records (level, message) since the last call."""
        ...
    def shutdown(self) -> None: ...


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
        if self._bus is not None and self._sub is not None:
            self._bus.unsubscribe(self._sub)
