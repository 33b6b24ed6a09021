"""Per-request sampling settings, validated once at submit so the hot loop never re-checks them.

The one home for what a sampling value may be: the CLI flags, the prompts file's JSON fields, the
dashboard and the HTTP API all build a ``SamplingParams`` and show its ``ValueError`` as is (the HTTP API
maps the field it names, ``SamplingParamError.field``, to the request field). Strict on types (``true`` is
not a seed, ``"no"`` is not ``ignore_eos``) because a value that only fails later fails inside sampling,
where it would take every other request of the batch down with it.

The names and meanings follow vLLM's ``SamplingParams`` where it has the field, so the HTTP API maps a
request onto this class field by field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Optional

from .arguments import is_unicode, short_repr

MAX_NEW_TOKENS = 2**31 - 1
"""Above any context length; the bound only keeps the number a 64-bit-safe trace value."""
SEED_RANGE = (0, 2**64 - 1)
"""A torch generator's seed is 64 bits."""
MAX_LOGPROBS = 20
"""Most alternatives one token's log-probabilities may list (OpenAI's chat limit, vLLM's default)."""
PENALTY_RANGE = (-2.0, 2.0)
"""presence and frequency penalties, as OpenAI bounds them."""
BIAS_RANGE = (-100.0, 100.0)
"""A logit bias, as OpenAI bounds it."""


class SamplingParamError(ValueError):
    """A sampling value that cannot be served; ``field`` names it (the HTTP API reports the request field)."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"{name} {problem}")
        self.field = name
        self.problem = problem


def _integer(name: str, v: Any, lo: int, hi: Optional[int] = None) -> None:
    if isinstance(v, bool) or not isinstance(v, int):
        raise SamplingParamError(name, f"must be an integer, got {short_repr(v)}")
    if v < lo:
        raise SamplingParamError(name, f"must be an integer >= {lo}, got {short_repr(v)}")
    if hi is not None and v > hi:
        raise SamplingParamError(name, f"must be at most {hi}, got {short_repr(v)}")


def _real(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise SamplingParamError(name, f"must be a number, got {short_repr(v)}")
    if isinstance(v, int) and v.bit_length() > 1000 or not math.isfinite(v):  # (a huge int overflows float)
        raise SamplingParamError(name, f"must be a finite number, got {short_repr(v)}")
    return float(v)


def _within(name: str, v: Any, lo: float, hi: float) -> None:
    if not lo <= _real(name, v) <= hi:
        raise SamplingParamError(name, f"must be in [{lo:g}, {hi:g}], got {short_repr(v)}")


def _token_ids(name: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)):
        raise SamplingParamError(name, f"must be a list of token ids, got {short_repr(value)}")
    for t in value:
        _integer(name, t, 0)
    return tuple(value)


def _logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """``{token id: bias}`` (ids as integers or as the decimal strings JSON keys are) as sorted pairs."""
    if isinstance(value, tuple):
        value = dict(value)
    if not isinstance(value, Mapping):
        raise SamplingParamError("logit_bias", f"must map token ids to numbers, got {short_repr(value)}")
    pairs = {}
    for key, bias in value.items():
        token = int(key) if isinstance(key, str) and key.strip().isdigit() else key
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise SamplingParamError("logit_bias", f"keys must be token ids (integers >= 0), got {short_repr(key)}")
        _within("logit_bias", bias, *BIAS_RANGE)
        if bias:  # a zero bias asks for nothing
            pairs[token] = float(bias)
    return tuple(sorted(pairs.items()))


@dataclass(frozen=True)
class SamplingParams:
    """What one request generates and how. ``logprobs``: each generated token's log-probability and its
    ``logprobs`` most likely alternatives (0: the token's own only; None: none); ``prompt_logprobs`` the
    same for every prompt token after the first. Both are the log-softmax of the model's raw logits, before
    penalties, bias and temperature (vLLM's default)."""

    max_new_tokens: int = 128
    min_tokens: int = 0  # no end-of-sequence token, stop token or stop string before this many tokens
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 means no top-k cut
    top_p: float = 1.0
    min_p: float = 0.0  # drop tokens less likely than min_p times the most likely one
    repetition_penalty: float = 1.0  # > 1 discourages tokens of the prompt and the output so far
    presence_penalty: float = 0.0  # subtracted once from the logit of each token already generated
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output so far
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit); a dict is taken
    seed: Optional[int] = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()  # generating one of these ends the request ("stop")
    include_stop_str_in_output: bool = False  # keep the stop string (or stop token's text) in the text
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    detokenize: bool = True
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    plain: bool = field(init=False, repr=False, compare=False, default=True)
    """Greedy, and nothing to do but the argmax: no penalty, bias, min_tokens or logprobs. Such rows keep
    the fast path (the decode graph's own argmax, the overlap schedule); the others go through the
    sampler's processing. Computed once here, read per row per step."""

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif isinstance(self.stop, list):
            object.__setattr__(self, "stop", tuple(self.stop))
        elif not isinstance(self.stop, tuple):
            raise SamplingParamError("stop", f"must be a string or a list of strings, got {short_repr(self.stop)}")
        _integer("max_new_tokens", self.max_new_tokens, 1, MAX_NEW_TOKENS)
        _integer("min_tokens", self.min_tokens, 0, MAX_NEW_TOKENS)  # past max_new_tokens: that ends it first
        if _real("temperature", self.temperature) < 0.0:
            raise SamplingParamError("temperature", f"must be >= 0, got {self.temperature!r}")
        _integer("top_k", self.top_k, 0)
        if not 0.0 < _real("top_p", self.top_p) <= 1.0:
            raise SamplingParamError("top_p", f"must be in (0, 1], got {self.top_p!r}")
        _within("min_p", self.min_p, 0.0, 1.0)
        if _real("repetition_penalty", self.repetition_penalty) <= 0.0:
            raise SamplingParamError("repetition_penalty", f"must be > 0, got {self.repetition_penalty!r}")
        _within("presence_penalty", self.presence_penalty, *PENALTY_RANGE)
        _within("frequency_penalty", self.frequency_penalty, *PENALTY_RANGE)
        object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))
        if self.seed is not None:
            _integer("seed", self.seed, *SEED_RANGE)
        if any(not isinstance(s, str) or not s or not is_unicode(s) for s in self.stop):
            raise SamplingParamError("stop", "strings must be non-empty strings of valid Unicode")
        object.__setattr__(self, "stop_token_ids", _token_ids("stop_token_ids", self.stop_token_ids))
        for name in ("include_stop_str_in_output", "ignore_eos", "skip_special_tokens", "detokenize"):
            if not isinstance(getattr(self, name), bool):
                raise SamplingParamError(name, f"must be true or false, got {short_repr(getattr(self, name))}")
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                _integer(name, getattr(self, name), 0, MAX_LOGPROBS)
        if self.stop and not self.detokenize:  # stop strings match the detokenized text
            raise SamplingParamError("stop", "strings need detokenize=True (they are matched against the text)")
        object.__setattr__(self, "plain", self.greedy and not self.processed and self.logprobs is None)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def processed(self) -> bool:
        """Whether the sampler changes this request's logits before it picks a token (penalties, bias,
        the min_tokens mask over the tokens that would end it); the neutral values change nothing and cost
        nothing, and min_tokens with ignore_eos and no stop token ids has nothing to mask."""
        return bool(
            self.repetition_penalty != 1.0
            or self.presence_penalty
            or self.frequency_penalty
            or self.logit_bias
            or (self.min_tokens and (not self.ignore_eos or self.stop_token_ids))
        )

    def vocab_problem(self, vocab_size: int) -> Optional[SamplingParamError]:
        """The error for a token id outside a vocabulary of ``vocab_size`` (logit_bias, stop_token_ids)."""
        for name, ids in (("logit_bias", [t for t, _ in self.logit_bias]), ("stop_token_ids", self.stop_token_ids)):
            bad = [t for t in ids if t >= vocab_size]
            if bad:
                return SamplingParamError(name, f"holds token id {bad[0]}, outside the vocabulary (size {vocab_size})")
        return None

    def replace(self, **changes: Any) -> "SamplingParams":
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        data.update(changes)
        return SamplingParams(**data)


def sampling_fields() -> tuple[str, ...]:
    """The names a ``SamplingParams`` is built from (every init field), for mappings that copy them by name."""
    return tuple(f.name for f in fields(SamplingParams) if f.init)
