"""Token sampling: one batched argmax for greedy rows, per-row filtering for the rest.

Greedy rows never touch a random generator, so greedy output is independent of batch makeup.
Seeded rows own a ``torch.Generator`` so a request's samples do not depend on its neighbours.
"""

from __future__ import annotations

import torch

from .request import Request

_MIN_TEMPERATURE = 1e-30  # below this every temperature samples the same way: the top logit


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
                req.generator = torch.Generator(device=probs.device).manual_seed(p.seed)
            gen = req.generator
        out[i] = int(torch.multinomial(probs, 1, generator=gen).item())
    return out
