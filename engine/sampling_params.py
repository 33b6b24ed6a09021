"""Per-request sampling settings, validated once at submit so the hot loop never re-checks them.

The one home for what a sampling value may be: the CLI flags, the prompts file's JSON fields and the
dashboard all build a ``SamplingParams`` and show its ``ValueError`` as is. Strict on types (``true`` is
not a seed, ``"no"`` is not ``ignore_eos``) because a value that only fails later fails inside sampling,
where it would take every other request of the batch down with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Optional

from .arguments import short_repr
from .telemetry.value_limits import is_unicode

MAX_NEW_TOKENS = 2**31 - 1
"""Above any context length; the bound only keeps the number a 64-bit-safe trace value."""
SEED_RANGE = (0, 2**64 - 1)
"""A torch generator's seed is 64 bits."""


def _integer(name: str, v: Any, lo: int, hi: Optional[int] = None) -> None:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{name} must be an integer, got {short_repr(v)}")
    if v < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {short_repr(v)}")
    if hi is not None and v > hi:
        raise ValueError(f"{name} must be at most {hi}, got {short_repr(v)}")


def _real(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{name} must be a number, got {short_repr(v)}")
    if isinstance(v, int) and v.bit_length() > 1000 or not math.isfinite(v):  # (a huge int overflows float)
        raise ValueError(f"{name} must be a finite number, got {short_repr(v)}")
    return float(v)


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 means no top-k cut
    top_p: float = 1.0
    seed: Optional[int] = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    detokenize: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif isinstance(self.stop, list):
            object.__setattr__(self, "stop", tuple(self.stop))
        elif not isinstance(self.stop, tuple):
            raise ValueError(f"stop must be a string or a list of strings, got {short_repr(self.stop)}")
        _integer("max_new_tokens", self.max_new_tokens, 1, MAX_NEW_TOKENS)
        if _real("temperature", self.temperature) < 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        _integer("top_k", self.top_k, 0)
        if not 0.0 < _real("top_p", self.top_p) <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None:
            _integer("seed", self.seed, *SEED_RANGE)
        if any(not isinstance(s, str) or not s or not is_unicode(s) for s in self.stop):
            raise ValueError("stop strings must be non-empty strings of valid Unicode")
        for name in ("ignore_eos", "detokenize"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {short_repr(getattr(self, name))}")
        if self.stop and not self.detokenize:  # stop strings match the detokenized text
            raise ValueError("stop strings need detokenize=True (they are matched against the text)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def replace(self, **changes: Any) -> "SamplingParams":
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data.update(changes)
        return SamplingParams(**data)
