"""Rotary position embedding for the default, linear, llama3, yarn and longrope rope types, over a head's
first ``rotary_dim`` dimensions (all of them but for a partial rotary factor, Phi-4-mini's).

The inverse-frequency math mirrors transformers' `ROPE_INIT_FUNCTIONS` line for line
(same float32 ops, same order) so logits match HF bit-for-bit in fp32. Unlike HF, which
recomputes cos/sin every step, the table is precomputed once for every position the
model supports: in forward it is a single gather by `positions`, which is what a CUDA
graph wants (no host work, no value-dependent shapes).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import torch
from torch import nn

from ..kernels import fused as tk
from ..spec import ModelSpec
from .norm import RMSNorm


def _base_inv_freq(base: float, dim: int) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))


def _llama3(inv_freq: torch.Tensor, p: dict) -> torch.Tensor:
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old_context_len = p["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low
    high_freq_wavelen = old_context_len / high
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama)


def _yarn(base: float, dim: int, p: dict, max_pos: int) -> tuple[torch.Tensor, float]:
    original = p["original_max_position_embeddings"]
    factor = p.get("factor") or max_pos / original
    attention_factor = p.get("attention_factor")
    mscale, mscale_all_dim = p.get("mscale"), p.get("mscale_all_dim")

    def get_mscale(scale: float, m: float = 1) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
        else:
            attention_factor = get_mscale(factor)
    beta_fast = p.get("beta_fast") or 32
    beta_slow = p.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        # HF's formula; a beta so small that the ratio overflows (a denormal beta_slow) puts the dim
        # past the ramp's end like any huge ratio, instead of ceil(inf) raising
        ratio = min(original / (rotations * 2 * math.pi), sys.float_info.max)
        return (dim * math.log(ratio)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # prevent singularity, as HF does
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    extrapolation_factor = 1 - ramp
    inv_freq = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor
    return inv_freq, float(attention_factor)


def _longrope(base: float, dim: int, p: dict, max_pos: int, factors: str) -> tuple[torch.Tensor, float]:
    """LongRoPE (Phi-3's "su"): the base frequencies divided by the per-frequency ``factors`` ("short_factor"
    or "long_factor"), and the cos/sin scale; HF's ``_compute_longrope_parameters``."""
    original = p["original_max_position_embeddings"]
    factor = p.get("factor") or max_pos / original
    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    ext = torch.tensor(p[factors], dtype=torch.float32)
    shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (ext * base**shape), float(attention_factor)


def rope_inv_freq(spec: ModelSpec, long: bool = False) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [rotary_dim/2] float32, cos/sin scale) exactly as HF computes them; ``long``: a
    longrope table's long factors (positions from the pretraining context on), else its short ones."""
    base, dim, p = spec.rope_theta, spec.rotary_dim, spec.rope_scaling or {}
    kind = spec.rope_type
    if kind == "yarn":
        return _yarn(base, dim, p, spec.max_position_embeddings)
    if kind == "longrope":
        return _longrope(base, dim, p, spec.max_position_embeddings, "long_factor" if long else "short_factor")
    inv_freq = _base_inv_freq(base, dim)
    if kind == "linear":
        return inv_freq / p["factor"], 1.0
    if kind == "llama3":
        return _llama3(inv_freq, p), 1.0
    return inv_freq, 1.0


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX layout (HF `rotate_half`): x [T, H, D]; cos, sin [T, 1, D/2]."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def _cos_sin(positions: torch.Tensor, spec: ModelSpec, long: bool = False) -> torch.Tensor:
    inv_freq, scale = rope_inv_freq(spec, long)
    freqs = positions[:, None] * inv_freq.to(positions.device)[None, :]
    return torch.cat((freqs.cos() * scale, freqs.sin() * scale), dim=-1)


class RotaryEmbedding(nn.Module):
    """Holds `cos_sin_cache` [max_context_len, rotary_dim] (cos | sin halves), float32.

    A longrope table rotates the positions inside the pretraining context with the short factors and the
    later ones with the long factors. transformers instead switches a whole sequence to the long factors
    once it grows past that context (dropping its KV cache to re-rotate every position), which a KV cache
    cannot follow: within the pretraining context the two agree exactly, past it each key keeps the
    rotation of its own position.

    The buffer is non-persistent (never in a checkpoint); call `reset_cache()` after
    materialising a meta-built model, and keep it float32 (load in the final dtype
    rather than calling `.to(dtype)` on a loaded model, which would cast it).
    """

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.register_buffer("cos_sin_cache", torch.empty(0), persistent=False)
        self.reset_cache()

    def reset_cache(self, device: torch.device | str | None = None) -> None:
        device = self.cos_sin_cache.device if device is None else torch.device(device)
        spec = self.spec
        positions = torch.arange(spec.max_context_len, device=device, dtype=torch.int64).float()
        if spec.rope_type != "longrope":
            self.cos_sin_cache = _cos_sin(positions, spec)
            return
        short = int(spec.rope_scaling["original_max_position_embeddings"])
        self.cos_sin_cache = torch.cat((_cos_sin(positions[:short], spec), _cos_sin(positions[short:], spec, True)))

    def factors(self, positions: torch.Tensor, dtype: torch.dtype) -> "RopeFactors":
        """The factors at ``positions``, for every layer of one forward (per layer, the lookup and
        cast are a measurable share of a small model's CPU step)."""
        cos, sin = self.cos_sin_cache[positions].to(dtype).unsqueeze(1).chunk(2, dim=-1)
        return RopeFactors(torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1))

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.cos_sin_cache[positions].to(q.dtype).unsqueeze(1).chunk(2, dim=-1)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin)


@dataclass(frozen=True)
class RopeFactors:
    """cos and sign-folded sin at full rotary width [T, 1, R]: ``apply`` rotates in 5 ops instead of
    ``apply_rope``'s 8, with the same result bit for bit (x2 * -sin is exactly -(x2 * sin)). Where R is
    less than the head's width (a partial rotary factor) the rest of each head passes through."""

    cos: torch.Tensor
    signed_sin: torch.Tensor

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        rotary = self.cos.shape[-1]
        if rotary == x.shape[-1]:
            x1, x2 = x.chunk(2, dim=-1)
            return x * self.cos + torch.cat((x2, x1), dim=-1) * self.signed_sin
        rot, rest = x[..., :rotary], x[..., rotary:]
        x1, x2 = rot.chunk(2, dim=-1)
        return torch.cat((rot * self.cos + torch.cat((x2, x1), dim=-1) * self.signed_sin, rest), dim=-1)


def fused_norm_rope(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    rope: RotaryEmbedding,
    q_norm: RMSNorm | None = None,
    k_norm: RMSNorm | None = None,
) -> torch.Tensor:
    """The fused path's q/k RMSNorm (Qwen3: ``q_norm`` and ``k_norm`` given) and RoPE in one launch
    (models/kernels/fused.py), from the cached table: returns a contiguous q, rotates k (a strided view of
    the fused projection is fine) in place."""
    if q_norm is not None and k_norm is not None:
        return tk.qk_norm_rope(positions, q, k, rope.cos_sin_cache, q_norm.weight, k_norm.weight, q_norm.eps)
    return tk.qk_norm_rope(positions, q, k, rope.cos_sin_cache)
