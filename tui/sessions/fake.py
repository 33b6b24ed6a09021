"""A scripted stand-in for the engine: publishes fixed events, streams canned text.

Used by the pilot and snapshot tests (deterministic: fixed timestamps, no threads, no clocks) and
handy for working on the dashboard without loading a model. Everything the real
:class:`~graphtop.tui.sessions.local.EngineSession` does is mirrored closely enough that the app cannot
tell them apart.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

from graphtop.engine.telemetry.events import (
    CaptureFinished,
    CaptureProgress,
    CaptureStarted,
    EngineStarted,
    Event,
    KVPoolState,
    MemoryLedger,
    RecaptureFinished,
    RecaptureRequested,
    RequestFinished,
    RequestQueued,
    StepEvent,
)

from .base import Limits, SamplingSettings

GiB = 1024**3
MiB = 1024**2
T0 = 1_700_000_000.0
"""Fixed epoch for scripted events so snapshots never depend on the wall clock."""


@dataclass
class FakeHandle:
    """Streams ``chunks`` one per ``new_text`` call, then finishes."""

    request_id: str
    chunks: list[str]
    finished: bool = False
    finish_reason: Optional[str] = None
    error: Optional[str] = None
    text: str = ""
    _pending: deque = field(default_factory=deque)

    def __post_init__(self) -> None:
        self._pending = deque(self.chunks)

    def new_text(self) -> str:
        if not self._pending:
            if not self.finished:
                self.finished = True
                self.finish_reason = "length"
            return ""
        chunk = self._pending.popleft()
        self.text += chunk
        if not self._pending:
            self.finished = True
            self.finish_reason = "length"
        return chunk


def boot_events(
    decode: Sequence[int] = (1, 2, 4, 8, 16, 32),
    prefill: Sequence[int] = (64, 128, 256, 512),
    *,
    emulated: bool = False,
    model: str = "demo-tiny-llama",
    ts: float = T0,
) -> list[Event]:
    """Model load + capture of both phases + memory ledger, as the engine emits them."""
    out: list[Event] = [
        EngineStarted(
            model=model,
            architecture="LlamaForCausalLM",
            device="cuda:0",
            device_name="NVIDIA H200",
            dtype="bfloat16",
            attention_backend="flashinfer",
            attention_backend_note="flashinfer selected · model kernels: triton-fused",
            decode_graph_backend="emulated" if emulated else "full",
            prefill_graph_backend="emulated" if emulated else "breakable",
            emulated=emulated,
            demo=True,
            ts=ts,
        )
    ]
    t = ts
    for phase, buckets, per in (("decode", decode, 3 * MiB), ("prefill", prefill, 40 * 1024)):
        out.append(CaptureStarted(phase=phase, buckets=tuple(buckets), backend="full", ts=t))
        for i, b in enumerate(buckets, 1):
            t += 0.05
            out.append(
                CaptureProgress(
                    phase=phase,
                    bucket=b,
                    index=i,
                    total=len(buckets),
                    seconds=0.05 + 0.01 * i,
                    memory_bytes=per * b,
                    ts=t,
                )
            )
        mem = sum(per * b for b in buckets)
        out.append(CaptureFinished(phase=phase, captured=tuple(buckets), seconds=0.5, memory_bytes=mem, ts=t))
    out.append(
        MemoryLedger(
            device="cuda:0",
            total=141 * GiB,
            weights=15 * GiB,
            kv_pool=96 * GiB,
            decode_graphs=189 * MiB,
            prefill_graphs=38 * MiB,
            activation_reserve=4 * GiB,
            free=25 * GiB,
            ts=t,
        )
    )
    out.append(KVPoolState(capacity_tokens=65536, used_tokens=0, page_size=16, max_running=64, ts=t))
    return out


def step_events(n: int = 40, *, start_step: int = 1, ts: float = T0 + 10) -> list[Event]:
    """A deterministic mix of decode hits, prefill hits and eager fallbacks."""
    decode = (1, 2, 4, 8, 16, 32)
    out: list[Event] = []
    for i in range(n):
        step = start_step + i
        t = ts + i * 0.02
        if i % 10 == 0:
            out.append(
                StepEvent(
                    step=step,
                    phase="prefill",
                    batch_size=1,
                    num_tokens=100 + i % 25,
                    bucket=128,
                    padded=28 - i % 25,
                    padding_waste=(28 - i % 25) / 128,
                    path="graph",
                    host_ms=0.4,
                    replay_ms=3.0 + i * 0.05,
                    segment_ms=2.5,
                    break_ms=0.3,
                    ts=t,
                )
            )
        elif i % 13 == 0:
            out.append(
                StepEvent(
                    step=step,
                    phase="decode",
                    batch_size=48,
                    num_tokens=48,
                    bucket=None,
                    path="eager",
                    fallback_reason="exceeds_max_bucket",
                    host_ms=9.5,
                    ts=t,
                )
            )
        elif i % 17 == 0:
            out.append(
                StepEvent(
                    step=step,
                    phase="prefill",
                    batch_size=1,
                    num_tokens=900,
                    bucket=None,
                    path="eager",
                    fallback_reason="prefill_tokens_over_max_bucket",
                    host_ms=22.0,
                    ts=t,
                )
            )
        else:
            bs = 3 + (i % 5) * 3
            bucket = next(b for b in decode if b >= bs)
            out.append(
                StepEvent(
                    step=step,
                    phase="decode",
                    batch_size=bs,
                    num_tokens=bs,
                    bucket=bucket,
                    padded=bucket - bs,
                    padding_waste=(bucket - bs) / bucket,
                    path="graph",
                    host_ms=0.2,
                    replay_ms=1.0 + (i % 7) * 0.1,
                    ts=t,
                )
            )
        if i % 8 == 0:
            out.append(
                KVPoolState(
                    capacity_tokens=65536,
                    used_tokens=4000 + i * 300,
                    page_size=16,
                    running=3 + i % 5,
                    queued=i % 3,
                    max_running=64,
                    ts=t,
                )
            )
    return out


class FakeSession:
    """Publishes ``script`` on ``start`` and records what the app asked of it."""

    kind = "live"
    replay = None
    hosts_engine = False
    detaches = False

    def __init__(
        self,
        script: Optional[Iterable[Event]] = None,
        *,
        label: str = "demo model (fake)",
        chat: bool = True,
        reply: str = "CUDA graphs replay a captured kernel sequence with one launch.",
        limits: Limits = Limits(max_running=64, kv_capacity_tokens=65536),
        start_error: Optional[str] = None,
    ) -> None:
        self.script = list(script) if script is not None else boot_events() + step_events()
        self.label = label
        self._chat = chat
        self.reply = reply
        self._limits = limits
        self.start_error = start_error
        self.queue: deque[Event] = deque()
        self.started = False
        self.submitted: list[tuple[str, SamplingSettings, bool]] = []
        self.recaptures: list[tuple[Optional[list[int]], Optional[list[int]]]] = []
        self.handles: list[FakeHandle] = []
        self.shut_down = False
        self._decode: Optional[list[int]] = None
        self._prefill: Optional[list[int]] = None
        self.parity_every = 0
        self.ended: Optional[str] = None  # tests set it to play an engine that went away
        self.silent_for: Optional[float] = None  # tests set it to play an engine that went quiet
        self.logs: list[tuple[int, str]] = []  # tests append engine log records

    def publish(self, *events: Event) -> None:
        """Tests push more events as if the engine had emitted them."""
        self.queue.extend(events)

    def start(self) -> None:
        if self.start_error:
            raise RuntimeError(self.start_error)
        for ev in self.script:
            if isinstance(ev, CaptureStarted):
                if ev.phase == "decode":
                    self._decode = list(ev.buckets)
                else:
                    self._prefill = list(ev.buckets)
        self.queue.extend(self.script)
        self.started = True

    def drain(self, max_items: Optional[int] = None) -> list[Event]:
        n = len(self.queue) if max_items is None else min(max_items, len(self.queue))
        return [self.queue.popleft() for _ in range(n)]

    @property
    def dropped(self) -> int:
        return 0

    @property
    def can_submit(self) -> bool:
        return self.started

    @property
    def chat_available(self) -> bool:
        return self._chat

    def submit(self, prompt: str, settings: SamplingSettings, chat: bool) -> FakeHandle:
        chat = chat and self._chat  # as the engine session: the template only when there is one
        self.submitted.append((prompt, settings, chat))
        rid = f"req-{len(self.submitted)}"
        words = self.reply.split(" ")
        handle = FakeHandle(rid, [w + " " for w in words[:-1]] + [words[-1]])
        self.handles.append(handle)
        self.queue.append(
            RequestQueued(
                request_id=rid, prompt_tokens=len(prompt.split()), max_new_tokens=settings.max_new_tokens, ts=T0 + 20
            )
        )
        self.queue.append(
            RequestFinished(
                request_id=rid, output_tokens=len(words), finish_reason="length", latency_ms=12.0, ts=T0 + 21
            )
        )
        return handle

    def recapture(self, decode_bs: Optional[list[int]], prefill_num_tokens: Optional[list[int]]) -> None:
        self.recaptures.append((decode_bs, prefill_num_tokens))
        t = T0 + 30
        self.queue.append(
            RecaptureRequested(
                decode_bs=tuple(decode_bs) if decode_bs is not None else None,
                prefill_num_tokens=tuple(prefill_num_tokens) if prefill_num_tokens is not None else None,
                ts=t,
            )
        )
        for phase, buckets in (("decode", decode_bs), ("prefill", prefill_num_tokens)):
            if buckets is None:
                continue
            if phase == "decode":
                self._decode = list(buckets)
            else:
                self._prefill = list(buckets)
            self.queue.append(CaptureStarted(phase=phase, buckets=tuple(buckets), reason="recapture", ts=t))
            for i, b in enumerate(buckets, 1):
                self.queue.append(
                    CaptureProgress(
                        phase=phase, bucket=b, index=i, total=len(buckets), seconds=0.05, memory_bytes=MiB * b, ts=t
                    )
                )
            self.queue.append(
                CaptureFinished(
                    phase=phase, captured=tuple(buckets), seconds=0.1, memory_bytes=MiB * sum(buckets), ts=t
                )
            )
        self.queue.append(
            RecaptureFinished(
                ok=True,
                decode_bs=tuple(decode_bs or ()),
                prefill_num_tokens=tuple(prefill_num_tokens or ()),
                seconds=0.2,
                message="recaptured",
                ts=t,
            )
        )

    def buckets(self) -> tuple[Optional[list[int]], Optional[list[int]]]:
        return self._decode, self._prefill

    def limits(self) -> Limits:
        return self._limits

    def set_parity_every(self, every: int) -> None:
        self.parity_every = every

    def drain_logs(self) -> list[tuple[int, str]]:
        out, self.logs = self.logs, []
        return out

    def shutdown(self) -> None:
        self.shut_down = True
