"""Token sampling: one batched argmax for greedy rows, per-row filtering for the rest.

Greedy rows never touch a random generator, so greedy output is independent of batch makeup.
Seeded rows own a ``torch.Generator`` so a request's samples do not depend on its neighbours.
"""

from __future__ import annotations

import torch

from .request import Request

_MIN_TEMPERATURE = 1e-30  # below this every temperature samples the same way: the top logit
_MASK64 = 2**64 - 1


def generator_seed(seed: int, device: torch.device) -> int:
    """The seed handed to ``device``'s torch generator for a request's 64-bit ``seed``.

    The CPU generator (a Mersenne Twister) keeps only the low 32 bits, so seeds 1 and 2**32 + 1 sampled
    the same tokens. Seeds of 32 bits pass as they are (their samples do not change); larger ones are
    mixed down (splitmix64's finaliser), so seeds that differ only above bit 31 differ here too. The
    CUDA generator (Philox) takes all 64 bits."""
    if device.type != "cpu" or seed < 2**32:
        return seed
    z = (seed + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & 0xFFFFFFFF


def _filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        cum = torch.cumsum(probs, dim=-1)
        drop = cum - probs > top_p  # keep the smallest prefix whose mass reaches top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(0, order, sorted_logits)
    return logits


def sample(logits: torch.Tensor, requests: list[Request]) -> list[int]:
    """``logits`` is [len(requests), vocab] in the model's dtype; returns one token id per request."""
    if not requests:
        return []
    # .cpu() before .tolist(): the device wait happens inside a torch op, which releases the GIL, so
    # subscriber threads (recorder, dashboard) do their work while the GPU runs instead of after it.
    greedy = torch.argmax(logits, dim=-1).cpu()
    if all(r.params.greedy for r in requests):
        return greedy.tolist()
    out = greedy.tolist()
    for i, req in enumerate(requests):
        p = req.params
        if p.greedy:
            continue
        row = logits[i].float()
        # Shift before scaling: softmax is unchanged, and a tiny temperature sends the other logits to
        # -inf instead of sending the largest to +inf (inf - inf = NaN in softmax). The floor keeps the
        # divisor a float32 normal number (1e-300 would round to 0, and 0 / 0 = NaN).
        row = (row - row.max()) / max(p.temperature, _MIN_TEMPERATURE)
        row = _filter_logits(row, p.top_k, p.top_p)
        probs = torch.softmax(row, dim=-1)
        gen = None
        if p.seed is not None:
            if req.generator is None:
                req.generator = torch.Generator(device=probs.device).manual_seed(generator_seed(p.seed, probs.device))
            gen = req.generator
        out[i] = int(torch.multinomial(probs, 1, generator=gen).item())
    return out
