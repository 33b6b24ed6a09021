"""Which shapes get graphs, which backends capture them, and what was changed automatically.

Precedence: ``--cuda-graph-config`` JSON beats the convenience flags, which beat defaults. Every key
the user set is *locked*: auto-downgrade (e.g. capping decode max_bs at max_running_requests, or
disabling decode graphs for an attention backend that cannot be captured) only touches unlocked keys,
and each downgrade is reported with a reason.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from ..arguments import short_repr
from .bucket_list import MAX_BUCKETS, BucketList, BucketSpecError  # noqa: F401 (MAX_BUCKETS re-exported)

DECODE_BACKENDS = ("full", "disabled")
PREFILL_BACKENDS = ("breakable", "disabled")
DEFAULT_DECODE_MAX_BS = 256
DEFAULT_PREFILL_PADDING_CAP = 0.25  # refuse a prefill graph when padding exceeds 25 % of real tokens
_MAX_DEFAULT_STEP = 512  # the widest gap between two neighbours of a default bucket list

KEYS = (
    "decode.backend",
    "decode.bs",
    "decode.max_bs",
    "prefill.backend",
    "prefill.num_tokens",
    "prefill.max_num_tokens",
    "prefill.max_padding_waste",
)
_OPTIONAL_KEYS = ("decode.bs", "decode.max_bs", "prefill.num_tokens", "prefill.max_num_tokens")  # None: a default
_LIST_KEYS = ("decode.bs", "prefill.num_tokens")


class GraphConfigError(ValueError):
    """A graph config the user gave cannot be used; the message is one line."""


def default_decode_buckets(max_bs: int) -> list[int]:
    """SGLang's decode list: fine steps where batches are common, coarser above."""
    sizes = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 497, 16))
    sizes += list(range(512, max(max_bs, 512) + 1, 32))
    return sorted({s for s in sizes if s <= max_bs})


def default_prefill_buckets(max_tokens: int) -> list[int]:
    sizes = list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
    sizes += list(range(576, 1025, 64)) + list(range(1280, 4097, 256))
    sizes += list(range(4608, max(max_tokens, 4608) + 1, 512))
    return sorted({s for s in sizes if s <= max_tokens})


def clamp_buckets(sizes: list[int], limit: int) -> list[int]:
    """Drop sizes above ``limit``; append ``limit`` itself when the list reached past it."""
    kept = sorted({s for s in sizes if s <= limit})
    if sizes and max(sizes) > limit and limit not in kept and limit > 0:
        kept.append(limit)
    return kept


@dataclass
class GraphConfig:
    decode_backend: str = "full"
    decode_bs: Optional[list[int]] = None
    decode_max_bs: Optional[int] = None
    prefill_backend: str = "breakable"
    prefill_num_tokens: Optional[list[int]] = None
    prefill_max_num_tokens: Optional[int] = None
    prefill_max_padding_waste: float = DEFAULT_PREFILL_PADDING_CAP
    # Without CUDA, run the graph logic through the emulated backend (True) or serve eagerly with
    # FallbackReason.NO_CUDA_GRAPHS (False: no per-step emulation cost on a CPU).
    emulate: bool = True
    # Capture with the GC frozen (GraphBackend.capture_session). Off by default: on the H200 freezing
    # made capture slower, with a small heap and with 3 million extra objects (bench/capture_bench.py,
    # figures in docs/benchmarks.md).
    freeze_gc: bool = False
    # Record graphs while a step is on the device, and run only the warmup forwards between steps
    # (graphs/model_runner.py). Off by default until measured on a GPU (docs/benchmarks.md, cold start).
    record_in_flight: bool = False
    locked: set[str] = field(default_factory=set)

    def set(self, key: str, value: Any, lock: bool = True) -> None:
        attr = key.replace(".", "_")
        setattr(self, attr, value)
        if lock:
            self.locked.add(key)

    def get(self, key: str) -> Any:
        return getattr(self, key.replace(".", "_"))

    def validated(self) -> "GraphConfig":
        """A checked, normalised copy (lists sorted and de-duplicated, bucket text parsed); the caller's
        object is left as it is. A config built in Python goes through ``_checked``, the same checks as
        JSON and flags, so a bad value is a one-line GraphConfigError here instead of a crash mid-step.
        An empty bucket list is the one thing Python may say that JSON may not: the phase stays on with
        no graphs (every step eager with no_graphs_captured)."""
        values: dict[str, Any] = {}
        for key in KEYS:
            value = self.get(key)
            if value is None and key in _OPTIONAL_KEYS:
                continue
            if key in _LIST_KEYS and isinstance(value, list) and not value:
                continue
            values[key.replace(".", "_")] = _checked(key, value)
        return replace(self, locked=set(self.locked), **values)

    def validate(self) -> None:
        """Raise GraphConfigError (a ValueError, one line) for the first value the JSON path would refuse."""
        self.validated()

    def as_dict(self) -> dict[str, Any]:
        return {
            "decode": {"backend": self.decode_backend, "bs": self.decode_bs, "max_bs": self.decode_max_bs},
            "prefill": {
                "backend": self.prefill_backend,
                "num_tokens": self.prefill_num_tokens,
                "max_num_tokens": self.prefill_max_num_tokens,
                "max_padding_waste": self.prefill_max_padding_waste,
            },
        }


def _positive_int(key: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise GraphConfigError(f"cuda graph config: {key} must be an integer, got {short_repr(v)}")
    if v <= 0:
        raise GraphConfigError(f"cuda graph config: {key} must be positive, got {short_repr(v)}")
    return v


def _size_list(key: str, v: Any) -> list[int]:
    """A bucket list from JSON (a list or the flags' text), a flag (already a ``BucketList``) or Python,
    checked by ``BucketList``: the refusal is its message after the key."""
    name = f"cuda graph config: {key}"
    try:
        if isinstance(v, BucketList):
            return v.as_list()
        if isinstance(v, str):
            return BucketList.parse(v).as_list()
        if not isinstance(v, list):
            raise GraphConfigError(f"{name} must be a list of integers")
        return BucketList(v).as_list()
    except BucketSpecError as e:
        raise GraphConfigError(f"{name}: {e}") from None


def check_buckets_fit_pool(key: str, sizes: list[int], pool_tokens: int, what: str = " bucket") -> None:
    """A bucket larger than the KV pool can never run (a batch or a prefill step holds at most the
    pool's tokens) and its static buffers alone could exhaust memory: refused even when locked."""
    too_big = [s for s in sizes if s > pool_tokens]
    if too_big:
        raise GraphConfigError(
            f"cuda graph config: {key}{what} {too_big[0]:,} is over the KV pool's {pool_tokens:,} tokens; "
            "a graph that large can never run"
        )


def _check_locked_maxima(cfg: "GraphConfig", pool_tokens: int) -> None:
    for key in ("decode.max_bs", "prefill.max_num_tokens"):
        if key in cfg.locked and cfg.get(key) is not None:
            check_buckets_fit_pool(key, [cfg.get(key)], pool_tokens, what="")


def _defaults_within(make: Any, span: int, limit: int) -> list[int]:
    """``make(span)`` restricted to what matters under ``limit``: the same list after clamping, built
    without materialising millions of sizes for a huge (locked) maximum."""
    return make(min(span, limit + _MAX_DEFAULT_STEP))


def _backend(key: str, v: Any, allowed: tuple[str, ...]) -> str:
    if v not in allowed:
        raise GraphConfigError(f"cuda graph config: unknown {key} {short_repr(v)}; choose {' or '.join(allowed)}")
    return v


def _checked(key: str, value: Any) -> Any:
    """``value`` for ``key`` checked and normalised: the one set of rules for JSON, flags and Python."""
    if key == "decode.backend":
        value = _backend(key, value, DECODE_BACKENDS)
    elif key == "prefill.backend":
        value = _backend(key, value, PREFILL_BACKENDS)
    elif key in ("decode.bs", "prefill.num_tokens"):
        value = _size_list(key, value)
    elif key in ("decode.max_bs", "prefill.max_num_tokens"):
        value = _positive_int(key, value)
    elif key == "prefill.max_padding_waste":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            raise GraphConfigError(f"cuda graph config: {key} must be a finite number >= 0, got {short_repr(value)}")
        value = float(value)
    return value


def _apply(cfg: GraphConfig, key: str, value: Any) -> None:
    cfg.set(key, _checked(key, value))


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a finite number")


def build_graph_config(json_text: Optional[str], flags: dict[str, Any]) -> GraphConfig:
    """Merge convenience flags (``{"decode.bs": [...], ...}``, None = unset) and the JSON config."""
    cfg = GraphConfig()
    for key, value in flags.items():
        if value is not None:
            _apply(cfg, key, value)
    if json_text:
        try:
            data = json.loads(json_text, parse_constant=_refuse_constant)
        except json.JSONDecodeError as e:
            raise GraphConfigError(f"cuda graph config is not valid JSON: {e.msg} at column {e.colno}") from None
        except RecursionError:
            raise GraphConfigError("cuda graph config is nested too deeply") from None
        except ValueError as e:  # NaN/Infinity, or an integer of more than 4300 digits
            raise GraphConfigError(f"cuda graph config: {str(e).splitlines()[0][:80]}") from None
        if not isinstance(data, dict):
            raise GraphConfigError("cuda graph config must be a JSON object with 'decode' and/or 'prefill'")
        for phase, body in data.items():
            if phase not in ("decode", "prefill"):
                raise GraphConfigError(
                    f"cuda graph config: unknown phase {short_repr(phase)}; use 'decode' or 'prefill'"
                )
            if not isinstance(body, dict):
                raise GraphConfigError(f"cuda graph config: {phase} must be a JSON object")
            for name, value in body.items():
                key = f"{phase}.{name}"
                if key not in KEYS:
                    raise GraphConfigError(f"cuda graph config: unknown key {short_repr(key)}")
                _apply(cfg, key, value)
    return cfg


@dataclass(frozen=True)
class Downgrade:
    key: str
    old: Any
    new: Any
    reason: str


@dataclass
class ResolvedGraphConfig:
    """What the engine will actually capture, after limits and downgrades."""

    decode_backend: str
    decode_bs: list[int]
    prefill_backend: str
    prefill_num_tokens: list[int]
    prefill_max_padding_waste: float
    emulated: bool
    available: bool  # CUDA graphs, or emulation asked for; False: every step is eager (no_cuda_graphs)
    locked: frozenset[str]
    downgrades: list[Downgrade]

    def as_dict(self) -> dict[str, Any]:
        return {
            "decode": {"backend": self.decode_backend, "bs": self.decode_bs},
            "prefill": {
                "backend": self.prefill_backend,
                "num_tokens": self.prefill_num_tokens,
                "max_padding_waste": self.prefill_max_padding_waste,
            },
            "emulated": self.emulated,
            "available": self.available,
        }


def resolve_graph_config(
    cfg: GraphConfig,
    *,
    max_running: int,
    pool_tokens: int,
    chunked_prefill_size: int,
    cuda_graphs_available: bool,
    attention_supports_decode_graph: bool,
) -> ResolvedGraphConfig:
    cfg = cfg.validated()  # an Engine built without EngineConfig.validate is held to the same rules
    downgrades: list[Downgrade] = []
    _check_locked_maxima(cfg, pool_tokens)

    def downgrade(key: str, new: Any, reason: str) -> Any:
        old = cfg.get(key)
        if key in cfg.locked:
            return old
        if old != new:
            downgrades.append(Downgrade(key, old, new, reason))
        return new

    decode_backend = cfg.decode_backend
    if decode_backend == "full" and not attention_supports_decode_graph:
        if "decode.backend" in cfg.locked:
            raise GraphConfigError(
                "decode graphs were asked for, but the attention backend cannot be captured in a graph"
            )
        decode_backend = downgrade("decode.backend", "disabled", "attention backend is not capturable")

    bs_limit = min(max_running, pool_tokens)
    max_bs = cfg.decode_max_bs
    if max_bs is None:
        max_bs = min(DEFAULT_DECODE_MAX_BS, bs_limit)
    elif max_bs > bs_limit:
        max_bs = downgrade("decode.max_bs", bs_limit, f"max running requests is {bs_limit}")
    # Defaults span the unclamped maximum, so clamping appends the limit (max running requests) when
    # it cuts the list; an unlocked explicit list is clamped the same way, and that is reported.
    if cfg.decode_bs is not None:
        decode_bs = list(cfg.decode_bs)
    else:
        decode_bs = _defaults_within(
            default_decode_buckets, cfg.decode_max_bs or DEFAULT_DECODE_MAX_BS, min(max_bs, bs_limit)
        )
    if "decode.bs" not in cfg.locked:
        limit = min(max_bs, bs_limit)
        clamped = clamp_buckets(decode_bs, limit)
        if clamped != sorted(set(decode_bs)) and cfg.decode_bs is not None:
            downgrades.append(Downgrade("decode.bs", decode_bs, clamped, f"limited to {limit} requests"))
        decode_bs = clamped

    max_tokens = cfg.prefill_max_num_tokens
    token_limit = min(chunked_prefill_size, pool_tokens)
    if max_tokens is None:
        max_tokens = token_limit
    elif max_tokens > token_limit:
        max_tokens = downgrade(
            "prefill.max_num_tokens", token_limit, f"a prefill step never exceeds {token_limit} tokens"
        )
    if cfg.prefill_num_tokens is not None:
        prefill_tokens = list(cfg.prefill_num_tokens)
    else:  # up to the step maximum; clamping then appends the pool size when the pool is smaller
        prefill_tokens = _defaults_within(
            default_prefill_buckets, cfg.prefill_max_num_tokens or chunked_prefill_size, max_tokens
        )
    if "prefill.num_tokens" not in cfg.locked:
        clamped = clamp_buckets(prefill_tokens, max_tokens)
        if clamped != sorted(set(prefill_tokens)) and cfg.prefill_num_tokens is not None:
            downgrades.append(
                Downgrade(
                    "prefill.num_tokens", prefill_tokens, clamped, f"a prefill step never exceeds {max_tokens} tokens"
                )
            )
        prefill_tokens = clamped

    if decode_backend != "disabled":
        check_buckets_fit_pool("decode.bs", decode_bs, pool_tokens)
    if cfg.prefill_backend != "disabled":
        check_buckets_fit_pool("prefill.num_tokens", prefill_tokens, pool_tokens)
    return ResolvedGraphConfig(
        decode_backend=decode_backend,
        decode_bs=decode_bs if decode_backend != "disabled" else [],
        prefill_backend=cfg.prefill_backend,
        prefill_num_tokens=prefill_tokens if cfg.prefill_backend != "disabled" else [],
        prefill_max_padding_waste=cfg.prefill_max_padding_waste,
        emulated=not cuda_graphs_available,
        available=cuda_graphs_available or cfg.emulate,
        locked=frozenset(cfg.locked),
        downgrades=downgrades,
    )
