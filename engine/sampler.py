"""Token sampling, batched: tensor ops over all rows and one device-to-host copy per step.

Greedy rows (``SamplingParams.greedy``) take ``torch.argmax`` of their logits and never touch a random
generator, so greedy output is independent of batch makeup. The other rows are filtered together: each
row is shifted by its max, divided by its temperature, cut to its top-k (every token tied with the k-th
value stays) and to its top-p (the smallest prefix, in descending order with ties to the lower id,
whose mass reaches top-p), in the order and float32 arithmetic of a per-row loop.

Why not ``torch.multinomial`` per row: each call returns through ``Tensor.item``, a device sync per row per
step, and a per-row loop of small kernels. Instead every sampled row races exponentials: with
``w = exp(logits)`` (the probabilities up to their sum) and ``E`` independent Exp(1) draws,
``argmax(w / E)`` is token ``j`` with probability exactly ``w_j / sum(w)`` (``E_i / w_i`` is Exp of rate
``w_i``, and the least of independent exponentials is ``j`` with probability ``w_j / sum(w)``). That is
one batched argmax; the winners are scattered into the greedy argmax and the step copies one tensor to
the host.

Rows that are not plain greedy (``SamplingParams.plain``) take the longer way, still one pass over all
of them: processed rows (penalties, logit bias, min_tokens: engine/penalties.py) pick from their
processed logits, greedy ones by argmax and the others through the filter above; rows that asked for
log-probabilities get the log-softmax of their raw logits (vLLM's default: before penalties, bias and
temperature), the chosen token's value and the top alternatives, and a prefill step's prompt-scoring rows
(``PromptRows``) the same for the prompt tokens they score. All of it is packed with the tokens into one
float64 tensor, so the step still copies one tensor to the host.

Randomness: ``E = -log(U)``, ``U`` uniform in float64 (resolution 2**-53, so rare tokens are not lost to a
coarse grid). Unseeded rows draw ``U`` from the device's default generator in one call. A seeded row
draws its own row of ``U`` from its request's ``torch.Generator``, a full vocabulary per sampled token
whatever its neighbours are, so its tokens depend only on its seed, its logits and its parameters, never
on batch makeup. A seed samples different tokens than the per-row ``torch.multinomial`` this replaced.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import torch

from .batch import ForwardBatch
from .penalties import process_rows
from .request import Request, TokenLogprob
from .sampling_params import SamplingParams

_MIN_TEMPERATURE = 1e-30  # below this every temperature samples the same way: the top logit
_MASK64 = 2**64 - 1


def generator_seed(seed: int, device: torch.device) -> int:
    """The seed handed to ``device``'s torch generator for a request's 64-bit ``seed``.

    The CPU generator (a Mersenne Twister) keeps only the low 32 bits, so seeds 1 and 2**32 + 1 sampled
    the same tokens. Seeds of 32 bits pass as they are; larger ones are mixed down (splitmix64's
    finaliser), so seeds that differ only above bit 31 differ here too. The CUDA generator (Philox) takes
    all 64 bits."""
    if device.type != "cpu" or seed < 2**32:
        return seed
    z = (seed + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & 0xFFFFFFFF


def _top_k(p: SamplingParams, vocab: int) -> int:
    return p.top_k if p.top_k < vocab else 0  # 0: no cut


def _table(params: Sequence[SamplingParams], vocab: int, rows: Sequence[int], device: torch.device) -> torch.Tensor:
    """[n, 5] on ``device``: row, temperature (floored), top-p (inf: no cut), top-k (0: no cut), log(min-p)
    (-inf: no cut). One non-blocking host-to-device copy (a blocking one would wait for the step's forward)."""
    host = torch.tensor(
        [
            (
                row,
                max(p.temperature, _MIN_TEMPERATURE),
                p.top_p if p.top_p < 1.0 else math.inf,
                _top_k(p, vocab),
                math.log(p.min_p) if p.min_p > 0.0 else -math.inf,
            )
            for row, p in zip(rows, params)
        ],
        dtype=torch.float64,
    )
    return host.to(device, non_blocking=True)


def _filter(x: torch.Tensor, table: torch.Tensor, any_top_p: bool, max_k: int, any_min_p: bool = False) -> torch.Tensor:
    """``x`` [n, vocab] float32 logits; returns them shifted, scaled and cut (cut tokens are -inf).

    Shift before scaling: softmax is unchanged, and a tiny temperature sends the other logits to -inf
    instead of sending the largest to +inf (inf - inf = NaN in softmax). The floor keeps the divisor a
    float32 normal number (1e-300 would round to 0, and 0 / 0 = NaN)."""
    x = (x - x.amax(dim=-1, keepdim=True)) / table[:, 1:2].float()
    if any_min_p:  # the largest value is 0 now: p / p_max < min_p is x < log(min_p)
        x = x.masked_fill(x < table[:, 4:5].float(), -math.inf)
    if max_k:
        k = table[:, 3:4].long()
        kth = torch.topk(x, max_k, dim=-1).values.gather(1, (k - 1).clamp(min=0))
        kth = kth.masked_fill(k == 0, -math.inf)  # no cut: nothing is below -inf
        x = x.masked_fill(x < kth, -math.inf)  # every token tied with the k-th value stays
    if any_top_p:
        ranked, order = torch.sort(x, dim=-1, descending=True, stable=True)  # ties: lower id first
        probs = torch.softmax(ranked, dim=-1)
        cum = torch.cumsum(probs, dim=-1)
        drop = cum - probs > table[:, 2:3].float()  # keep the smallest prefix whose mass reaches top_p
        x = torch.full_like(x, -math.inf).scatter(1, order, ranked.masked_fill(drop, -math.inf))
    return x


def _filter_rows(
    x: torch.Tensor, params: Sequence[SamplingParams], rows: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows ``rows`` of ``x``, filtered by ``params``; and those rows' indices, on ``x``'s device."""
    vocab = x.shape[-1]
    table = _table(params, vocab, rows, x.device)
    idx = table[:, 0].long()
    any_top_p = any(p.top_p < 1.0 for p in params)
    max_k = max(_top_k(p, vocab) for p in params)
    return _filter(x.index_select(0, idx).float(), table, any_top_p, max_k, any(p.min_p for p in params)), idx


def filter_logits(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Each row of ``logits`` [n, vocab] as its ``params`` samples from it: float32, shifted by the row's
    max, divided by its temperature, top-k and top-p cut to -inf. The sampler's own filter."""
    return _filter_rows(logits, params, range(len(params)))[0]


def _generator(req: Request, device: torch.device) -> torch.Generator:
    if req.generator is None:
        req.generator = torch.Generator(device=device).manual_seed(generator_seed(req.params.seed, device))
    return req.generator


@dataclass
class PromptRows:
    """A prefill step's prompt-scoring logits (``StepOutput.prompt_logits``), the prompt token each row
    scores, and how many alternatives its request asked for."""

    logits: torch.Tensor
    targets: list[int]
    top: list[int]

    @classmethod
    def of(cls, logits: Optional[torch.Tensor], batch: ForwardBatch) -> Optional["PromptRows"]:
        if logits is None or not batch.prompt_rows:
            return None
        top = [k for req, n in batch.prompt_requests for k in itertools.repeat(req.params.prompt_logprobs, n)]
        return cls(logits, batch.prompt_targets, top)


@dataclass
class Sampled:
    """A step's tokens, one per sampled row; each row's log-probabilities when its request asked for them;
    the prompt tokens' log-probabilities, in the order of ``ForwardBatch.prompt_targets``."""

    tokens: list[int]
    logprobs: Optional[list[Optional[TokenLogprob]]] = None
    prompt_logprobs: Optional[list[TokenLogprob]] = None


def sample(logits: torch.Tensor, requests: list[Request]) -> list[int]:
    """``logits`` is [len(requests), vocab] in the model's dtype; returns one token id per request."""
    return sample_step(logits, requests).tokens


def sample_step(
    logits: torch.Tensor,
    requests: list[Request],
    eos_ids: frozenset[int] = frozenset(),
    prompt: Optional[PromptRows] = None,
) -> Sampled:
    """One step's sampling: a token per request (``eos_ids``: what min_tokens holds back), with the
    log-probabilities its request asked for, and those of ``prompt``'s rows; one device-to-host copy."""
    if not requests and prompt is None:
        return Sampled([])
    tokens = torch.argmax(logits, dim=-1)
    special = [i for i, r in enumerate(requests) if not r.params.plain]
    if not special and prompt is None:
        # .cpu() before .tolist(): the device wait happens inside a torch op, which releases the GIL, so
        # subscriber threads (recorder, dashboard) do their work while the GPU runs instead of after it.
        return Sampled(tokens.cpu().tolist())
    if special:
        tokens = _pick(logits, requests, special, tokens, eos_ids)
    vocab = logits.shape[-1]
    wanted = [i for i in special if requests[i].params.logprobs is not None]
    tops = [min(requests[i].params.logprobs or 0, vocab) for i in wanted]
    parts = [tokens]
    if wanted:
        parts += _logprob_parts(logits, _ints(wanted, logits.device), tokens, max(tops))
    if prompt is not None:
        prompt_tops = [min(k, vocab) for k in prompt.top]
        targets = _ints(prompt.targets, prompt.logits.device)
        parts += _logprob_parts(prompt.logits, None, targets, max(prompt_tops))
    host = torch.cat([p.flatten().double() for p in parts]).cpu().tolist()  # the step's one copy
    n = len(requests)
    out = Sampled([int(t) for t in host[:n]])
    at = n
    if wanted:
        entries, at = _unpack(host, at, [out.tokens[i] for i in wanted], tops)
        out.logprobs = [None] * n
        for i, entry in zip(wanted, entries):
            out.logprobs[i] = entry
    if prompt is not None:
        out.prompt_logprobs = _unpack(host, at, prompt.targets, prompt_tops)[0]
    return out


def _ints(values: Sequence[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64).to(device, non_blocking=True)


def _pick(
    logits: torch.Tensor, requests: list[Request], special: list[int], tokens: torch.Tensor, eos_ids: frozenset[int]
) -> torch.Tensor:
    """The tokens of the rows that are not plain greedy: processed (penalties, bias, min_tokens) greedy rows
    take the argmax of their processed logits, the sampled rows race exponentials over their filtered ones."""
    device = logits.device
    proc = [i for i in special if requests[i].params.processed]
    processed = None
    if proc:
        processed = process_rows(
            logits.index_select(0, _ints(proc, device)).float(), [requests[i] for i in proc], eos_ids
        )
        greedy = [j for j, i in enumerate(proc) if requests[i].params.greedy]
        if greedy:
            picked = torch.argmax(processed.index_select(0, _ints(greedy, device)), dim=-1)
            tokens = tokens.index_copy(0, _ints([proc[j] for j in greedy], device), picked)
    rows = [i for i in special if not requests[i].params.greedy]
    if not rows:
        return tokens
    rows.sort(key=lambda i: requests[i].params.seed is not None)  # unseeded first: one draw covers them
    params = [requests[i].params for i in rows]
    table = _table(params, logits.shape[-1], rows, device)
    idx = table[:, 0].long()
    src = logits.index_select(0, idx).float()
    if processed is not None:  # sampled rows that were processed sample from their processed logits
        where = {i: j for j, i in enumerate(proc)}
        pairs = [(k, where[i]) for k, i in enumerate(rows) if i in where]
        if pairs:
            at, of = zip(*pairs)
            src.index_copy_(0, _ints(at, device), processed.index_select(0, _ints(of, device)))
    max_k = max(_top_k(p, src.shape[-1]) for p in params)
    x = _filter(src, table, any(p.top_p < 1.0 for p in params), max_k, any(p.min_p for p in params))
    u = torch.empty(x.shape, dtype=torch.float64, device=device)
    free = sum(p.seed is None for p in params)
    if free:
        u[:free].uniform_()
    for j in range(free, len(rows)):
        u[j].uniform_(generator=_generator(requests[rows[j]], device))
    # argmax(w / E) with E = -log(U) is argmax(log(U) / w): no NaN (log(U) < 0), and w = 0 or U = 0 give -inf
    return tokens.index_copy(0, idx, torch.argmax(u.log_() / x.exp(), dim=-1))


def _logprob_parts(
    logits: torch.Tensor, idx: Optional[torch.Tensor], chosen: torch.Tensor, top: int
) -> list[torch.Tensor]:
    """The log-softmax of the raw logits (rows ``idx``, all when None): the chosen tokens' values, and the
    ``top`` largest values with their token ids, for the step's one host copy."""
    x = logits if idx is None else logits.index_select(0, idx)
    lp = torch.log_softmax(x.float(), dim=-1)
    picked = chosen if idx is None else chosen.index_select(0, idx)
    parts = [lp.gather(1, picked.unsqueeze(1))]
    top = min(top, lp.shape[-1])
    if top:
        best = torch.topk(lp, top, dim=-1)
        parts += [best.values, best.indices]
    return parts


def _unpack(host: list[float], at: int, tokens: Sequence[int], tops: list[int]) -> tuple[list[TokenLogprob], int]:
    """Read what ``_logprob_parts`` packed, from ``host[at:]``; each row keeps the alternatives it asked for."""
    n, k = len(tokens), max(tops, default=0)
    chosen = host[at : at + n]
    values = host[at + n : at + n + n * k]
    ids = host[at + n + n * k : at + n + 2 * n * k]
    out = [
        TokenLogprob(int(t), lp, tuple(zip(map(int, ids[r * k : r * k + m]), values[r * k : r * k + m])))
        for r, (t, lp, m) in enumerate(zip(tokens, chosen, tops))
    ]
    return out, at + n + 2 * n * k
