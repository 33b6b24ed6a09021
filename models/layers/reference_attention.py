"""ContiguousAttention: a plain, slow, obviously-correct `attn` for one sequence.

For tests and debugging only: it checks the model contract (full prompt, then one token
at a time) against transformers without the engine's paged cache. Each layer's K/V are
appended to a contiguous per-layer tensor; queries are the newest positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class ContiguousAttention:
    """Causal SDPA with GQA head repeat over everything this sequence has seen so far."""

    def __init__(self) -> None:
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}

    def reset(self) -> None:
        self.keys.clear()
        self.values.clear()

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> torch.Tensor:
        if layer_id in self.keys:
            k = torch.cat((self.keys[layer_id], k))
            v = torch.cat((self.values[layer_id], v))
        self.keys[layer_id], self.values[layer_id] = k, v
        new, total = q.shape[0], k.shape[0]
        rep = q.shape[1] // k.shape[1]
        k, v = (t.repeat_interleave(rep, dim=1).transpose(0, 1) for t in (k, v))
        if new == total:  # whole prompt: the same kernel path HF's sdpa takes
            o = F.scaled_dot_product_attention(q.transpose(0, 1), k, v, is_causal=True)
        else:
            q_pos = torch.arange(total - new, total, device=q.device)[:, None]
            mask = torch.arange(total, device=q.device)[None, :] <= q_pos
            o = F.scaled_dot_product_attention(q.transpose(0, 1), k, v, attn_mask=mask)
        return o.transpose(0, 1)
