"""The one seam between the dashboard and the engine.

The app talks only to a :class:`Session`: ``RemoteSession`` attaches to an engine's telemetry endpoint
(``graphtop``, ``graphtop attach``), ``local.EngineSession`` runs the engine in this process (Pilot
tests, benchmarks), tests use ``FakeSession`` (scripted events) and ``graphtop --replay`` uses
``ReplaySession``. Keeping the engine behind this adapter is what lets the whole dashboard be tested
without a GPU or a model.

Threading contract: ``start`` is blocking and runs in a textual thread worker; ``drain``,
``submit``, ``recapture`` are called from the UI thread and never block (the engine's own calls
are thread-safe and return at once). ``submit`` works from the first frame: a prompt typed while
the model loads is held (``prompt_queue``) and sent once the engine is ready.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Protocol

from graphtop.engine.telemetry.protocol import Sampling  # no torch: the wire's own modules

if TYPE_CHECKING:
    from graphtop.engine.telemetry.events import Event


class SessionError(RuntimeError):
    """``Session.start`` failed for a reason whose message says it all (e.g. the engine's own error,
    forwarded from another process): shown as is, without the exception's type name."""


SamplingSettings = Sampling
"""What the console sends with a prompt: the telemetry wire's sampling record, itself made from the engine's
``SamplingParams`` (so the two cannot drift); ``to_params()`` checks it by the engine's own rules, so a
prompt typed while the model loads is refused as it is typed, not later when the engine takes it."""


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
