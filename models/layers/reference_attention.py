"""ContiguousAttention: a plain, slow, obviously-correct `attn` for one sequence.

For tests and debugging only: it checks the model contract (full prompt, then one token
at a time) against transformers without the engine's paged cache. Each layer's K/V are
appended to a contiguous per-layer tensor; queries are the newest positions. ``for_spec`` attends as the
spec's model does: its logit scale, each layer's sliding window, its logits' soft cap.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ..spec import ModelSpec


class ContiguousAttention:
    """Causal SDPA with GQA head repeat over everything this sequence has seen so far (within a layer's window,
    where ``windows`` gives one)."""

    def __init__(
        self,
        scale: Optional[float] = None,
        windows: tuple[Optional[int], ...] = (),
        softcap: Optional[float] = None,
    ) -> None:
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        self.scale, self.windows, self.softcap = scale, windows, softcap

    @classmethod
    def for_spec(cls, spec: ModelSpec) -> "ContiguousAttention":
        return cls(spec.softmax_scale, spec.layer_windows(), spec.attn_softcap)

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
        window = self.windows[layer_id] if layer_id < len(self.windows) else None
        q = q.transpose(0, 1)
        if self.softcap is not None or window is not None:
            o = self._masked(q, k, v, total - new, window)
        elif new == total:  # whole prompt: the same kernel path HF's sdpa takes
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        else:
            q_pos = torch.arange(total - new, total, device=q.device)[:, None]
            mask = torch.arange(total, device=q.device)[None, :] <= q_pos
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        return o.transpose(0, 1)

    def _masked(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int, window: Optional[int]
    ) -> torch.Tensor:
        """The causal mask (and the window's) through SDPA, or with a soft cap transformers' eager attention:
        scores, soft cap, mask, float32 softmax."""
        q_pos = torch.arange(prefix, prefix + q.shape[1], device=q.device)[:, None]
        cols = torch.arange(k.shape[1], device=q.device)[None, :]
        mask = (cols <= q_pos) & (cols > q_pos - window if window is not None else True)
        if self.softcap is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        scale = q.shape[-1] ** -0.5 if self.scale is None else self.scale
        scores = torch.matmul(q, k.transpose(1, 2)) * scale
        if self.softcap is not None:
            scores = torch.tanh(scores / self.softcap) * self.softcap
        scores = scores.masked_fill(~mask, float("-inf"))
        return torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v)
