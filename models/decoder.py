"""One decoder for LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM.

The model sees a flat ragged batch of tokens (requests concatenated, no batch dim) and
their absolute `positions`; attention over the KV cache is delegated to the engine's
`attn` callable, which is the only thing that leaves the model. That keeps the module
free of padding, caches and batch logic, and keeps `forward` CUDA-graph capturable: no
host syncs, no value-dependent control flow, all shapes derived from input shapes.

Parameter names equal HF checkpoint names, so loading is a name -> parameter copy.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from .layers import RMSNorm, SwiGLUMLP
from .rope import RotaryEmbedding
from .spec import ModelSpec

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]
"""attn(q [T, H, D], k [T, KVH, D], v [T, KVH, D], layer_id) -> o [T, H, D].

Causal across each request of the ragged batch, softmax scale `spec.softmax_scale`; the
implementation stores k/v in its cache before attending."""


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, layer_id: int) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        q_size, kv_size = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        self.q_proj = nn.Linear(spec.hidden_size, q_size, bias=spec.qkv_bias)
        self.k_proj = nn.Linear(spec.hidden_size, kv_size, bias=spec.qkv_bias)
        self.v_proj = nn.Linear(spec.hidden_size, kv_size, bias=spec.qkv_bias)
        self.o_proj = nn.Linear(q_size, spec.hidden_size, bias=spec.o_bias)
        if spec.qk_norm:  # Qwen3: RMSNorm over each head's vector, before rope
            self.q_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps)
            self.k_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps)
        self.qk_norm = spec.qk_norm

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, rope: RotaryEmbedding, attn: AttentionFn
    ) -> torch.Tensor:
        q = self.q_proj(x).view(-1, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(-1, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(-1, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rope(positions, q, k)
        o = attn(q, k, v, self.layer_id)
        return self.o_proj(o.reshape(-1, self.num_heads * self.head_dim))


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, layer_id: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.self_attn = Attention(spec, layer_id)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.mlp = SwiGLUMLP(spec.hidden_size, spec.intermediate_size, spec.mlp_bias)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, rope: RotaryEmbedding, attn: AttentionFn
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions, rope, attn)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderModel(nn.Module):
    """The `model.` prefix of HF checkpoints: embeddings, layers, final norm, shared rope."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(spec, i) for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(spec)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionFn) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, positions, self.rotary_emb, attn)
        return self.norm(x)


class DecoderForCausalLM(nn.Module):
    """forward(input_ids [T], positions [T], attn) -> hidden [T, hidden]; compute_logits -> float32."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.model = DecoderModel(spec)
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share lm_head with the embeddings when the config says so.

        Must be re-run after anything that replaces parameters (e.g. `to_empty` from meta).
        """
        if self.spec.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionFn) -> torch.Tensor:
        return self.model(input_ids, positions, attn)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits for the rows of `hidden` the caller selected (usually each request's last token)."""
        return self.lm_head(hidden).float()
