"""Typed engine events: the one schema shared by the dashboard, the recorder and the logs.

Every event is a frozen dataclass with a ``type`` tag. ``to_dict`` gives the JSON object written to
traces, ``event_from_dict`` reads it back (and is how the dashboard replays a trace), and
``validate_event_dict`` checks a parsed object against the schema derived from these classes, so the
schema can never drift from the code.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

from .consistency import check_consistent
from .value_limits import SchemaError, check_free, check_range, check_text, short_repr

SCHEMA_VERSION = 1

ADDED = {"added": True}
"""Field metadata of a field added after schema version 1 shipped: a trace written before it may lack
the field, and reading such a trace gives the field its default (no version bump for an addition)."""


def _added(default: Any) -> Any:
    return field(default=default, metadata=ADDED)


def _now() -> float:
    return time.time()


@dataclass(frozen=True)
class Event:
    """Base of all events; ``ts`` is wall-clock seconds (time.time) when the engine emitted it."""

    type: ClassVar[str] = "event"
    ts: float = field(default_factory=_now, kw_only=True)

    @classmethod
    def fast(cls, **values: Any) -> "Event":
        """Hot-path constructor for the engine's per-step events: the same object as ``cls(**values)``
        (every field but ``ts`` given), without the frozen-dataclass ``__init__`` (6× cheaper)."""
        obj = object.__new__(cls)
        values.setdefault("ts", time.time())
        obj.__dict__.update(values)
        return obj

    def to_dict(self) -> dict[str, Any]:
        # Hot in the recorder thread (it holds the GIL the engine wants): field names are cached per
        # class and only container values take the slow conversion path.
        names = _FIELD_NAMES.get(type(self))
        if names is None:
            names = _FIELD_NAMES[type(self)] = tuple(f.name for f in dataclasses.fields(self))
        out: dict[str, Any] = {"type": self.type}
        d = self.__dict__
        for name in names:
            v = d[name]
            out[name] = _jsonable(v) if isinstance(v, (tuple, dict)) or dataclasses.is_dataclass(v) else v
        return out


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _jsonable(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: _jsonable(getattr(v, f.name)) for f in dataclasses.fields(v)}
    return v


@dataclass(frozen=True)
class TraceHeader(Event):
    """First line of every trace file."""

    type: ClassVar[str] = "header"
    schema_version: int = SCHEMA_VERSION
    graphtop_version: str = "0.1.0"
    meta: dict = field(default_factory=dict)


@dataclass(frozen=True)
class EngineStarted(Event):
    """Emitted once the model is loaded and the engine knows what it will run with."""

    type: ClassVar[str] = "engine_started"
    model: str = ""
    architecture: str = ""
    device: str = ""
    device_name: str = ""
    dtype: str = ""
    attention_backend: str = ""
    attention_backend_note: str = ""
    decode_graph_backend: str = ""
    prefill_graph_backend: str = ""
    emulated: bool = False
    graph_config: dict = field(default_factory=dict)
    locked_keys: tuple[str, ...] = ()
    demo: bool = False
    tp_size: int = _added(1)


@dataclass(frozen=True)
class LoadProgress(Event):
    """How far a long model load is, before ``engine_started``: a .gguf's one-time conversion into the
    cache (tens of seconds that later loads skip). ``total`` 0: a step of unknown length."""

    type: ClassVar[str] = "load_progress"
    label: str = ""  # what the load does: "converting GGUF to the cache (one time)"
    step: str = ""  # where it is: "reading the metadata", "tensor", "writing the converted folder", ...
    done: int = 0
    total: int = 0

    def describe(self) -> str:
        """``converting GGUF to the cache (one time) — tensor 12/272``."""
        where = f"{self.step} {self.done}/{self.total}" if self.total else self.step
        return f"{self.label} — {where}" if where else self.label


@dataclass(frozen=True)
class CaptureStarted(Event):
    type: ClassVar[str] = "capture_started"
    phase: str = ""  # decode | prefill
    buckets: tuple[int, ...] = ()
    backend: str = ""
    reason: str = "initial"  # initial | recapture
    rank: int = _added(0)


@dataclass(frozen=True)
class CaptureProgress(Event):
    """One bucket captured (or failed to); memory is the device-memory delta of that capture."""

    type: ClassVar[str] = "capture_progress"
    phase: str = ""
    bucket: int = 0
    index: int = 0  # 1-based
    total: int = 0
    seconds: float = 0.0
    memory_bytes: int = 0
    ok: bool = True
    failure_reason: Optional[str] = None
    rank: int = _added(0)


@dataclass(frozen=True)
class CaptureFinished(Event):
    """``kernels_compiled`` / ``kernels_cached``: Triton kernel variants the phase's buckets launch that
    worker processes compiled before their capture / that were loaded from the cache folder (0 where
    kernels compile as they are captured: no CUDA, ``precompile`` off, tensor parallel)."""

    type: ClassVar[str] = "capture_finished"
    phase: str = ""
    captured: tuple[int, ...] = ()
    failed: tuple[int, ...] = ()
    seconds: float = 0.0
    memory_bytes: int = 0
    ok: bool = True
    failure_reason: Optional[str] = None
    rank: int = _added(0)
    kernels_compiled: int = _added(0)
    kernels_cached: int = _added(0)


@dataclass(frozen=True)
class MemoryLedger(Event):
    """Where device (or host, on CPU) memory went, in bytes."""

    type: ClassVar[str] = "memory_ledger"
    device: str = ""
    total: int = 0
    weights: int = 0
    kv_pool: int = 0
    decode_graphs: int = 0
    prefill_graphs: int = 0
    activation_reserve: int = 0
    free: int = 0
    rank: int = _added(0)
    #: of ``weights``, a mixture of experts' expert weights (0 for a dense model)
    experts: int = _added(0)


@dataclass(frozen=True)
class KVPoolState(Event):
    type: ClassVar[str] = "kv_pool"
    capacity_tokens: int = 0
    used_tokens: int = 0
    page_size: int = 1
    running: int = 0
    queued: int = 0
    max_running: int = 0


@dataclass(frozen=True)
class StepEvent(Event):
    """One forward step: which bucket it hit, how much padding it wasted, why it fell back."""

    type: ClassVar[str] = "step"
    step: int = 0
    phase: str = ""  # decode | prefill | mixed
    batch_size: int = 0
    num_tokens: int = 0
    bucket: Optional[int] = None
    padded: int = 0
    padding_waste: float = 0.0
    path: str = "eager"  # graph | eager
    fallback_reason: Optional[str] = None
    host_ms: float = 0.0
    replay_ms: Optional[float] = None
    segment_ms: Optional[float] = None
    break_ms: Optional[float] = None
    emulated: bool = False
    forward_ms: Optional[float] = _added(None)  # an eager step's GPU time on CUDA (CUDA events)
    # host time from the step's start (any capture slice before it included) to its forward launched,
    # without waiting for the device: what the GPU waited on the host for, where host_ms of a step that
    # is sampled at once also holds its device time
    launch_ms: Optional[float] = _added(None)


@dataclass(frozen=True)
class ParityCheck(Event):
    """One graph step re-run eagerly on the same inputs, outside the graph, and the logits compared
    (``--parity-every N``). A mismatch means the graph computed something the eager path does not."""

    type: ClassVar[str] = "parity_check"
    step: int = 0
    phase: str = ""  # decode | prefill
    batch_size: int = 0
    num_tokens: int = 0
    bucket: Optional[int] = None
    rows: int = 0
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    argmax_agree: float = 1.0
    top5_overlap: float = 1.0
    tolerance: float = 0.0
    mismatch: bool = False
    check_ms: float = 0.0
    every: int = 0
    skipped: int = 0
    discarded: int = 0


@dataclass(frozen=True)
class ParityNotRun(Event):
    """A due parity check that gave no comparison, and why, so the stream shows it even when no later
    check follows: ``discarded`` (its requests' KV was freed while it ran: inconclusive),
    ``too_large`` (the step needs more scratch pages than are reserved), ``capture_pending`` (a
    recapture waits for the step loop). A check skipped because another was running is only counted:
    that one's event follows, with the counts."""

    type: ClassVar[str] = "parity_not_run"
    step: Optional[int] = None  # the step, when it was numbered (a skipped step is not yet)
    reason: str = ""
    skipped: int = 0
    discarded: int = 0
    every: int = 0


@dataclass(frozen=True)
class RankReplay(Event):
    """Replay times of a tensor-parallel worker rank (rank 0's are in its ``step`` events), sent in
    batches: the steps it replayed a graph for since its last batch."""

    type: ClassVar[str] = "rank_replay"
    rank: int = 0
    steps: tuple[int, ...] = ()
    replay_ms: tuple[float, ...] = ()


@dataclass(frozen=True)
class RequestQueued(Event):
    type: ClassVar[str] = "request_queued"
    request_id: str = ""
    prompt_tokens: int = 0
    max_new_tokens: int = 0


@dataclass(frozen=True)
class RequestFirstToken(Event):
    type: ClassVar[str] = "request_first_token"
    request_id: str = ""
    ttft_ms: float = 0.0
    queue_ms: Optional[float] = _added(None)  # of the TTFT, the time it waited before its first admission


@dataclass(frozen=True)
class RequestFinished(Event):
    type: ClassVar[str] = "request_finished"
    request_id: str = ""
    output_tokens: int = 0
    finish_reason: str = ""
    latency_ms: float = 0.0
    error: Optional[str] = None


@dataclass(frozen=True)
class RecaptureRequested(Event):
    type: ClassVar[str] = "recapture_requested"
    decode_bs: Optional[tuple[int, ...]] = None
    prefill_num_tokens: Optional[tuple[int, ...]] = None
    cause: str = _added("manual")  # manual (the editor, the API) | auto_tune
    detail: str = _added("")  # why, in words (auto-tune: the held-out gain and the memory it adds)


@dataclass(frozen=True)
class RecaptureFinished(Event):
    type: ClassVar[str] = "recapture_finished"
    ok: bool = True
    decode_bs: tuple[int, ...] = ()
    prefill_num_tokens: tuple[int, ...] = ()
    seconds: float = 0.0
    memory_freed_bytes: int = 0
    memory_bytes: int = 0
    message: str = ""


@dataclass(frozen=True)
class ConfigDowngrade(Event):
    """An unlocked graph-config key was changed automatically; ``reason`` says why."""

    type: ClassVar[str] = "config_downgrade"
    key: str = ""
    old: Any = None
    new: Any = None
    reason: str = ""


@dataclass(frozen=True)
class ErrorEvent(Event):
    type: ClassVar[str] = "error"
    message: str = ""
    where: str = ""
    fatal: bool = False
    rank: Optional[int] = _added(None)


EVENT_TYPES: dict[str, type[Event]] = {
    cls.type: cls
    for cls in (
        TraceHeader,
        EngineStarted,
        LoadProgress,
        CaptureStarted,
        CaptureProgress,
        CaptureFinished,
        MemoryLedger,
        KVPoolState,
        StepEvent,
        ParityCheck,
        ParityNotRun,
        RankReplay,
        RequestQueued,
        RequestFirstToken,
        RequestFinished,
        RecaptureRequested,
        RecaptureFinished,
        ConfigDowngrade,
        ErrorEvent,
    )
}


_JSON_TYPES: dict[Any, tuple[type, ...]] = {
    int: (int,),
    float: (int, float),
    str: (str,),
    bool: (bool,),
    dict: (dict,),
}


def _check_value(name: str, annotation: Any, value: Any) -> None:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is Any:
        check_free(name, value)
        return
    if origin is typing.Union:
        if value is None and type(None) in args:
            return
        inner = [a for a in args if a is not type(None)]
        _check_value(name, inner[0], value)
        return
    if origin is tuple:
        if not isinstance(value, list):
            raise SchemaError(f"field {name!r} should be a list, got {type(value).__name__}")
        for item in value:
            _check_value(name, args[0], item)
        return
    if origin is dict:
        annotation = dict
    allowed = _JSON_TYPES.get(annotation)
    if allowed is None:
        return
    if annotation is not bool and isinstance(value, bool):
        raise SchemaError(f"field {name!r} should be {annotation.__name__}, got bool")
    if not isinstance(value, allowed):
        raise SchemaError(f"field {name!r} should be {annotation.__name__}, got {type(value).__name__}")
    if annotation is str:
        check_text(name, value)
    elif annotation is dict:
        check_free(name, value)
    else:
        check_range(name, annotation, value)


@functools.lru_cache(maxsize=None)
def _type_hints(cls: type) -> dict[str, Any]:
    """Resolved annotations of an event class, cached: resolving them costs ~100 µs per call."""
    return typing.get_type_hints(cls)


def validate_event_dict(obj: Any) -> type[Event]:
    """Raise SchemaError unless ``obj`` is a valid event object; return its event class."""
    if not isinstance(obj, dict):
        raise SchemaError("event is not a JSON object")
    tag = obj.get("type")
    cls = EVENT_TYPES.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise SchemaError(f"unknown event type {short_repr(tag)}")
    hints = _type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in obj:
        if key != "type" and key not in names:
            raise SchemaError(f"{tag}: unexpected field {short_repr(key)}")
    for f in dataclasses.fields(cls):
        if f.name not in obj:
            if f.metadata.get("added"):
                continue
            raise SchemaError(f"{tag}: missing field {f.name!r}")
        _check_value(f"{tag}.{f.name}", hints[f.name], obj[f.name])
    check_consistent(tag, obj)
    return cls


def event_from_dict(obj: dict[str, Any]) -> Event:
    """Rebuild an event from its JSON object (validated first)."""
    cls = validate_event_dict(obj)
    hints = _type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in obj:  # a field added after this trace was written: its default
            continue
        v = obj[f.name]
        if typing.get_origin(hints[f.name]) is tuple or (
            typing.get_origin(hints[f.name]) is typing.Union and isinstance(v, list)
        ):
            v = tuple(v)
        kwargs[f.name] = v
    return cls(**kwargs)
