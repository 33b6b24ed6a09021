"""Per-request sampling settings, validated once at submit so the hot loop never re-checks them."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional


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
        elif not isinstance(self.stop, tuple):
            object.__setattr__(self, "stop", tuple(self.stop))
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if not (self.temperature >= 0.0):
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError("stop strings must be non-empty strings")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def replace(self, **changes: Any) -> "SamplingParams":
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data.update(changes)
        return SamplingParams(**data)
