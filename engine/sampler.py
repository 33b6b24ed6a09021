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

Randomness: ``E = -log(U)``, ``U`` uniform in float64 (resolution 2**-53, so rare tokens are not lost to a
coarse grid). Unseeded rows draw ``U`` from the device's default generator in one call. A seeded row
draws its own row of ``U`` from its request's ``torch.Generator``, a full vocabulary per sampled token
whatever its neighbours are, so its tokens depend only on its seed, its logits and its parameters, never
on batch makeup. A seed samples different tokens than the per-row ``torch.multinomial`` this replaced.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .request import Request
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
    """[n, 4] on ``device``: row, temperature (floored), top-p (inf: no cut), top-k (0: no cut). One
    non-blocking host-to-device copy (a blocking one would wait for the step's forward)."""
    host = torch.tensor(
        [
            (row, max(p.temperature, _MIN_TEMPERATURE), p.top_p if p.top_p < 1.0 else math.inf, _top_k(p, vocab))
            for row, p in zip(rows, params)
        ],
        dtype=torch.float64,
    )
    return host.to(device, non_blocking=True)


def _filter(x: torch.Tensor, table: torch.Tensor, any_top_p: bool, max_k: int) -> torch.Tensor:
    """``x`` [n, vocab] float32 logits; returns them shifted, scaled and cut (cut tokens are -inf).

    Shift before scaling: softmax is unchanged, and a tiny temperature sends the other logits to -inf
    instead of sending the largest to +inf (inf - inf = NaN in softmax). The floor keeps the divisor a
    float32 normal number (1e-300 would round to 0, and 0 / 0 = NaN)."""
    x = (x - x.amax(dim=-1, keepdim=True)) / table[:, 1:2].float()
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
    return _filter(x.index_select(0, idx).float(), table, any_top_p, max(_top_k(p, vocab) for p in params)), idx


def filter_logits(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Each row of ``logits`` [n, vocab] as its ``params`` samples from it: float32, shifted by the row's
    max, divided by its temperature, top-k and top-p cut to -inf. The sampler's own filter."""
    return _filter_rows(logits, params, range(len(params)))[0]


def _generator(req: Request, device: torch.device) -> torch.Generator:
    if req.generator is None:
        req.generator = torch.Generator(device=device).manual_seed(generator_seed(req.params.seed, device))
    return req.generator


def sample(logits: torch.Tensor, requests: list[Request]) -> list[int]:
    """``logits`` is [len(requests), vocab] in the model's dtype; returns one token id per request."""
    if not requests:
        return []
    tokens = torch.argmax(logits, dim=-1)
    rows = [i for i, r in enumerate(requests) if not r.params.greedy]
    if rows:
        rows.sort(key=lambda i: requests[i].params.seed is not None)  # unseeded first: one draw covers them
        device, params = logits.device, [requests[i].params for i in rows]
        x, idx = _filter_rows(logits, params, rows)
        u = torch.empty(x.shape, dtype=torch.float64, device=device)
        free = sum(p.seed is None for p in params)
        if free:
            u[:free].uniform_()
        for j in range(free, len(rows)):
            u[j].uniform_(generator=_generator(requests[rows[j]], device))
        # argmax(w / E) with E = -log(U) is argmax(log(U) / w): no NaN (log(U) < 0), and w = 0 or U = 0 give -inf
        tokens = tokens.index_copy(0, idx, torch.argmax(u.log_() / x.exp(), dim=-1))
    # .cpu() before .tolist(): the device wait happens inside a torch op, which releases the GIL, so
    # subscriber threads (recorder, dashboard) do their work while the GPU runs instead of after it.
    return tokens.cpu().tolist()
