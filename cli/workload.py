"""Seeded synthetic requests for ``--synthetic N``: reproducible load without a dataset.

Determinism: everything derives from ``seed`` through independent streams (lengths, arrivals, and
one stream per request's token ids), so the same arguments always give the same requests, and
request *i*'s prompt does not change when ``n`` changes. String seeds for ``random.Random`` are
hashed with SHA-512, not Python's randomized ``hash``, so this holds across processes.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import AbstractSet, Any, Iterable, Iterator, Optional, Union

__all__ = [
    "DEFAULT_OUTPUT_LEN",
    "DEFAULT_PROMPT_LEN",
    "Dist",
    "SyntheticRequest",
    "SyntheticWorkload",
    "for_engine",
    "sampling_params",
]

DEFAULT_PROMPT_LEN = "uniform:16:256"
"""``--synthetic-prompt-len``'s default."""
DEFAULT_OUTPUT_LEN = "uniform:16:128"
"""``--synthetic-output-len``'s default."""

_FORMS = "uniform:LO:HI, fixed:N, lognormal:MEAN:SIGMA or choice:A,B,..."
MAX_SIGMA = 10.0  # already a tail of e**10 times the median: anything larger is a typo
_MAX_LOG_LENGTH = 64.0  # e**64 tokens: past every context length, and exp() stays finite


@dataclass(frozen=True)
class Dist:
    """A distribution of positive integer lengths, parsed from a short spec string.

    * ``fixed:N`` - always N;
    * ``uniform:LO:HI`` - integers LO..HI inclusive;
    * ``lognormal:MEAN:SIGMA`` - log-normal whose *mean* is MEAN tokens and whose underlying
      normal has standard deviation SIGMA (heavy tail grows with SIGMA); rounded, clipped to >= 1;
    * ``choice:A,B,...`` - one of the listed values, uniformly.
    """

    kind: str
    params: tuple[float, ...]

    @classmethod
    def parse(cls, spec: Union[str, "Dist"]) -> "Dist":
        """Parse ``spec``; raises ``ValueError`` with a one-line message on a bad spec."""
        if isinstance(spec, Dist):
            return spec
        if not isinstance(spec, str):
            raise ValueError(f"bad length distribution {spec!r}: expected a string like {_FORMS}")
        kind, _, rest = spec.strip().partition(":")
        kind = kind.lower()

        def bad(why: str) -> ValueError:
            return ValueError(f"bad length distribution {spec!r}: {why}")

        def ints(parts: list[str]) -> tuple[int, ...]:
            try:
                return tuple(int(p) for p in parts)
            except ValueError:
                raise bad("values must be integers") from None

        parts = rest.split(":") if rest else []
        if kind == "fixed":
            if len(parts) != 1:
                raise bad("expected fixed:N")
            (n,) = ints(parts)
            if n < 1:
                raise bad("N must be >= 1")
            return cls("fixed", (n,))
        if kind == "uniform":
            if len(parts) != 2:
                raise bad("expected uniform:LO:HI")
            lo, hi = ints(parts)
            if lo < 1 or hi < lo:
                raise bad("need 1 <= LO <= HI")
            return cls("uniform", (lo, hi))
        if kind == "lognormal":
            if len(parts) != 2:
                raise bad("expected lognormal:MEAN:SIGMA")
            try:
                mean, sigma = float(parts[0]), float(parts[1])
            except ValueError:
                raise bad("MEAN and SIGMA must be numbers") from None
            if not (math.isfinite(mean) and mean > 0):
                raise bad("MEAN must be > 0")
            if not (math.isfinite(sigma) and 0 <= sigma <= MAX_SIGMA):
                raise bad(f"SIGMA must be in [0, {MAX_SIGMA:g}]")
            return cls("lognormal", (mean, sigma))
        if kind == "choice":
            values = [v for v in rest.split(",") if v.strip()] if rest else []
            if not values:
                raise bad("expected choice:A,B,...")
            choices = ints([v.strip() for v in values])
            if min(choices) < 1:
                raise bad("choices must be >= 1")
            return cls("choice", choices)
        raise bad(f"unknown kind {kind!r}; expected {_FORMS}")

    def sample(self, rng: random.Random) -> int:
        """One value (>= 1) drawn with ``rng``."""
        p = self.params
        if self.kind == "fixed":
            return int(p[0])
        if self.kind == "uniform":
            return rng.randint(int(p[0]), int(p[1]))
        if self.kind == "lognormal":
            mean, sigma = p
            mu = math.log(mean) - sigma * sigma / 2.0  # so that E[X] == mean
            # lognormvariate is exp(normalvariate); capping the exponent keeps a far tail draw finite
            # (lengths are clipped to the context anyway) and leaves every other draw unchanged.
            return max(1, round(math.exp(min(rng.normalvariate(mu, sigma), _MAX_LOG_LENGTH))))
        if self.kind == "choice":
            return int(rng.choice(p))
        raise ValueError(f"unknown distribution kind {self.kind!r}")

    def __str__(self) -> str:
        if self.kind == "choice":
            return "choice:" + ",".join(str(int(v)) for v in self.params)
        return ":".join([self.kind] + [f"{v:g}" for v in self.params])


@dataclass(frozen=True)
class SyntheticRequest:
    """One generated request; ``arrival_s`` is seconds after the workload starts."""

    index: int
    prompt_token_ids: list[int]
    max_new_tokens: int
    arrival_s: float


class _TokenSampler:
    """Uniform ids in [low, vocab_size) minus ``avoid``; rejection when few ids are avoided."""

    def __init__(self, vocab_size: int, low: int, avoid: AbstractSet[int]) -> None:
        if not 0 <= low < vocab_size:
            raise ValueError(f"need 0 <= low ({low}) < vocab_size ({vocab_size})")
        self.low, self.high = low, vocab_size
        self.avoid = frozenset(i for i in avoid if low <= i < vocab_size)
        span = vocab_size - low
        if len(self.avoid) >= span:
            raise ValueError(f"no token ids left in [{low}, {vocab_size}) after avoiding {len(self.avoid)}")
        # With more than half the range avoided, rejection gets slow; sample from an explicit list.
        self.allowed: Optional[list[int]] = None
        if len(self.avoid) * 2 > span:
            self.allowed = [i for i in range(low, vocab_size) if i not in self.avoid]

    def sample(self, rng: random.Random, n: int) -> list[int]:
        if self.allowed is not None:
            return [rng.choice(self.allowed) for _ in range(n)]
        out: list[int] = []
        randrange, avoid, low, high = rng.randrange, self.avoid, self.low, self.high
        while len(out) < n:
            i = randrange(low, high)
            if i not in avoid:
                out.append(i)
        return out


class SyntheticWorkload:
    """``n`` reproducible requests with random prompts, lengths and (optionally Poisson) arrivals.

    ``arrival_rate`` None puts every request at t=0 (a closed burst); otherwise arrivals form a
    Poisson process at that rate (req/s): the first request arrives at t=0 and gaps are
    exponential with mean ``1/arrival_rate``. ``max_total_tokens`` (e.g. the model's context length)
    clips prompt length to ``max_total_tokens - 1`` and output length to what is left.
    Iterating twice yields the same requests.
    """

    def __init__(
        self,
        n: int,
        seed: int,
        prompt_len: Union[str, Dist] = "uniform:16:256",
        output_len: Union[str, Dist] = "uniform:16:256",
        arrival_rate: Optional[float] = None,
        *,
        vocab_size: int,
        low: int = 0,
        avoid_ids: Iterable[int] = (),
        max_total_tokens: Optional[int] = None,
    ) -> None:
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"number of synthetic requests must be an integer >= 0, got {n!r}")
        if arrival_rate is not None and not (math.isfinite(arrival_rate) and arrival_rate > 0):
            raise ValueError(f"arrival rate must be > 0 requests/s, got {arrival_rate!r}")
        if max_total_tokens is not None and max_total_tokens < 2:
            raise ValueError(f"max_total_tokens must be >= 2, got {max_total_tokens}")
        self.n = n
        self.seed = seed
        self.prompt_len = Dist.parse(prompt_len)
        self.output_len = Dist.parse(output_len)
        self.arrival_rate = arrival_rate
        self.vocab_size = vocab_size
        self.low = low
        self.max_total_tokens = max_total_tokens
        self._tokens = _TokenSampler(vocab_size, low, frozenset(avoid_ids))

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[SyntheticRequest]:
        lengths = random.Random(f"graphtop:{self.seed}:lengths")
        arrivals = random.Random(f"graphtop:{self.seed}:arrivals")
        t = 0.0
        for i in range(self.n):
            prompt = self.prompt_len.sample(lengths)
            output = self.output_len.sample(lengths)
            if self.max_total_tokens is not None:
                prompt = min(prompt, self.max_total_tokens - 1)
                output = max(1, min(output, self.max_total_tokens - prompt))
            if self.arrival_rate is not None and i > 0:
                t += arrivals.expovariate(self.arrival_rate)
            ids = self._tokens.sample(random.Random(f"graphtop:{self.seed}:tokens:{i}"), prompt)
            yield SyntheticRequest(index=i, prompt_token_ids=ids, max_new_tokens=output, arrival_s=t)

    def requests(self) -> list[SyntheticRequest]:
        """All requests as a list."""
        return list(self)

    def describe(self) -> str:
        """One line for logs and the trace header."""
        rate = "all at t=0" if self.arrival_rate is None else f"Poisson {self.arrival_rate:g} req/s"
        return (
            f"{self.n} synthetic requests, seed {self.seed}, prompt {self.prompt_len}, output {self.output_len}, {rate}"
        )


def for_engine(
    engine: Any,
    n: int,
    seed: int,
    prompt_len: Union[str, Dist] = DEFAULT_PROMPT_LEN,
    output_len: Union[str, Dist] = DEFAULT_OUTPUT_LEN,
    arrival_rate: Optional[float] = None,
) -> SyntheticWorkload:
    """The workload ``--synthetic N`` serves on ``engine``: prompts avoid its EOS and special token ids,
    and every request fits its context."""
    avoid = set(engine.spec.eos_token_ids) | set(getattr(engine.tokenizer, "all_special_ids", []) or [])
    return SyntheticWorkload(
        n,
        seed,
        prompt_len=prompt_len,
        output_len=output_len,
        arrival_rate=arrival_rate,
        vocab_size=engine.spec.vocab_size,
        avoid_ids=sorted(avoid),
        max_total_tokens=engine.max_context_len - 1,
    )


def sampling_params(
    request: SyntheticRequest, seed: int, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0
) -> Any:
    """What ``--synthetic`` asks of a request: exactly its output length (EOS ignored), sampled with the
    run's settings and a seed of its own (``seed`` + its index)."""
    from graphtop.engine.sampling_params import SamplingParams

    return SamplingParams(
        max_new_tokens=request.max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=seed + request.index,
        ignore_eos=True,
    )
