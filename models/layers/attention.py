"""The attention block of every family: q, k, v and o projections, optional per-head q/k norms, RoPE, and
the engine's ``attn`` between them (the only thing that leaves the model: ``decoder.AttentionFn``).

What differs per layer in how it attends (a sliding window, a logit soft cap, the logit scale) is the
attention backend's to apply, from the spec (``ModelSpec.window``, ``attn_softcap``, ``softmax_scale``):
nothing here depends on it, so the same module runs eagerly and inside graphs for every family.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import nn

from ..kernels.qkv_input import QKVInput
from ..spec import ModelSpec
from .norm import RMSNorm
from .rope import RopeFactors, RotaryEmbedding, fused_norm_rope

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]
"""attn(q [T, H, D], k [T, KVH, D], v [T, KVH, D], layer_id) -> o [T, H, D].

Causal across each request of the ragged batch, softmax scale `spec.softmax_scale`, within layer_id's
sliding window (`spec.window`) and logit soft cap (`spec.attn_softcap`) where it has them; the
implementation stores k/v in its cache before attending. It may also have a method
``forward_qkv(x: QKVInput, layer_id)`` (models/kernels/qkv_input.py) that
does the q/k norm, RoPE, store and attention from the fused projection in one go, or returns None
(engine/attention/base.py); the fused path tries it first."""


class Attention(nn.Module):
    """q/k/v/o with HF's names; ``norm_cls`` is the family's RMSNorm, used for q/k norms (``spec.qk_norm``)."""

    def __init__(self, spec: ModelSpec, layer_id: int, norm_cls: type[nn.Module] = RMSNorm) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        q_size, kv_size = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        self.q_proj = nn.Linear(spec.hidden_size, q_size, bias=spec.qkv_bias)
        self.k_proj = nn.Linear(spec.hidden_size, kv_size, bias=spec.qkv_bias)
        self.v_proj = nn.Linear(spec.hidden_size, kv_size, bias=spec.qkv_bias)
        self.o_proj = nn.Linear(q_size, spec.hidden_size, bias=spec.o_bias)
        if spec.qk_norm:  # Qwen3, Gemma 3: RMSNorm over each head's vector, before rope
            self.q_norm = norm_cls(spec.head_dim, spec.rms_norm_eps)
            self.k_norm = norm_cls(spec.head_dim, spec.rms_norm_eps)
        self.qk_norm = spec.qk_norm
        self.fused = False
        self.q_size, self.kv_size = q_size, kv_size
        self.qk_norm_weights: Optional[tuple[torch.Tensor, torch.Tensor, float]] = None  # set by ``fuse``

    @torch.no_grad()
    def fuse(self) -> None:
        """One GEMM for q, k and v (the fused-kernel path); the separate projections are dropped."""
        w = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
        self.qkv_proj = nn.Linear(
            w.shape[1], w.shape[0], bias=self.q_proj.bias is not None, device=w.device, dtype=w.dtype
        )
        self.qkv_proj.weight.copy_(w)
        if self.q_proj.bias is not None:
            self.qkv_proj.bias.copy_(torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias]))
        del self.q_proj, self.k_proj, self.v_proj
        self.qkv_proj.requires_grad_(False)
        self.fused = True
        # what attend_fused hands the attention, looked up once (models/layers/small_layer.py says why)
        self.qk_norm_weights = (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps) if self.qk_norm else None

    def attend_fused(
        self, qkv: torch.Tensor, positions: torch.Tensor, rope: RotaryEmbedding, attn: AttentionFn
    ) -> torch.Tensor:
        """Fused-path attention from the fused q|k|v projection: q/k-norm + RoPE in one launch, then
        ``attn``; returns o as [T, heads * head_dim], ready for o_proj."""
        fused = getattr(attn, "forward_qkv", None)
        if fused is not None:
            o = fused(QKVInput(qkv, positions, rope.cos_sin_cache, *(self.qk_norm_weights or ())), self.layer_id)
            if o is not None:
                return o.reshape(-1, self.num_heads * self.head_dim)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        q_norm, k_norm = (self.q_norm, self.k_norm) if self.qk_norm else (None, None)
        q = fused_norm_rope(positions, q, k, rope, q_norm, k_norm)
        return attn(q, k, v, self.layer_id).reshape(-1, self.num_heads * self.head_dim)

    def forward(self, x: torch.Tensor, rope: RopeFactors, attn: AttentionFn) -> torch.Tensor:
        """``rope``: the step's RoPE factors for this layer (``RotaryEmbedding.factors``)."""
        q = self.q_proj(x).view(-1, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(-1, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(-1, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rope.apply(q), rope.apply(k)
        o = attn(q, k, v, self.layer_id)
        return self.o_proj(o.reshape(-1, self.num_heads * self.head_dim))
