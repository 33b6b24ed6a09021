"""One decoder for LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM.

The model sees a flat ragged batch of tokens (requests concatenated, no batch dim) and
their absolute `positions`; attention over the KV cache is delegated to the engine's
`attn` callable, which is the only thing that leaves the model. That keeps the module
free of padding, caches and batch logic, and keeps `forward` CUDA-graph capturable: no
host syncs, no value-dependent control flow, all shapes derived from input shapes.

Parameter names equal HF checkpoint names, so loading is a name -> parameter copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn

from .kernels import gemv as tg
from .kernels import fused as tk
from .kernels import skinny as ts
from .layers.mlp import RMSNorm, SwiGLUMLP
from .layers.rope import RopeFactors, RotaryEmbedding
from .spec import ModelSpec

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]
"""attn(q [T, H, D], k [T, KVH, D], v [T, KVH, D], layer_id) -> o [T, H, D].

Causal across each request of the ragged batch, softmax scale `spec.softmax_scale`; the
implementation stores k/v in its cache before attending. It may also have a method
``forward_qkv(qkv, positions, cos_sin_cache, q_norm_weight, k_norm_weight, eps, layer_id)`` that
does the q/k norm, RoPE, store and attention from the fused projection in one go, or returns None
(engine/attention/base.py); the fused path tries it first."""


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
        self.fused = False
        self.q_size, self.kv_size = q_size, kv_size

    @torch.no_grad()
    def fuse(self) -> None:
        """One GEMM for q, k and v (the fused-kernel path); the separate projections are dropped."""
        w = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
        self.qkv_proj = nn.Linear(w.shape[1], w.shape[0], bias=self.q_proj.bias is not None,
                                  device=w.device, dtype=w.dtype)
        self.qkv_proj.weight.copy_(w)
        if self.q_proj.bias is not None:
            self.qkv_proj.bias.copy_(torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias]))
        del self.q_proj, self.k_proj, self.v_proj
        self.qkv_proj.requires_grad_(False)
        self.fused = True

    def attend_fused(self, qkv: torch.Tensor, positions: torch.Tensor, rope: RotaryEmbedding,
                     attn: AttentionFn) -> torch.Tensor:
        """Fused-path attention from the fused q|k|v projection: q/k-norm + RoPE in one launch, then
        ``attn``; returns o as [T, heads * head_dim], ready for o_proj."""
        fused = getattr(attn, "forward_qkv", None)
        if fused is not None:
            qw, kw = (self.q_norm.weight, self.k_norm.weight) if self.qk_norm else (None, None)
            o = fused(qkv, positions, rope.cos_sin_cache, qw, kw, self.q_norm.eps if self.qk_norm else 0.0,
                      self.layer_id)
            if o is not None:
                return o.reshape(-1, self.num_heads * self.head_dim)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q = tk.qk_norm_rope(positions, q, k, rope.cos_sin_cache, self.q_norm.weight, self.k_norm.weight,
                                self.q_norm.eps)
        else:
            q = tk.qk_norm_rope(positions, q, k, rope.cos_sin_cache)
        return attn(q, k, v, self.layer_id).reshape(-1, self.num_heads * self.head_dim)

    def forward(self, x: torch.Tensor, rope: RopeFactors, attn: AttentionFn) -> torch.Tensor:
        """``rope``: the step's RoPE factors (``RotaryEmbedding.factors``), shared by all layers."""
        q = self.q_proj(x).view(-1, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(-1, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(-1, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rope.apply(q), rope.apply(k)
        o = attn(q, k, v, self.layer_id)
        return self.o_proj(o.reshape(-1, self.num_heads * self.head_dim))


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, layer_id: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.self_attn = Attention(spec, layer_id)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.mlp = SwiGLUMLP(spec.hidden_size, spec.intermediate_size, spec.mlp_bias)
        self.gemv_pdl: tuple[bool, ...] = (False, False, False, False)  # qkv, o, gate_up, down (set_pdl)
        self.gate_up_trigger = False  # a plain gate|up GEMV lets the PDL down projection start early (set_pdl)
        # qkv, o, gate_up, down: row class -> skinny-GEMM config where it beat cuBLAS (set_skinny)
        self.skinny: tuple[dict[int, ts.Config], ...] = ({}, {}, {}, {})
        self.skinny_pdl = False
        self.silu_pdl = False
        # row class -> plain skinny config of gate|up where it has no fused SiLU·mul one (SiLU·mul kernel after)
        self.skinny_gate_up_plain: dict[int, ts.Config] = {}
        # row classes whose add+RMSNorms ride in the skinny projections around them (set_skinny)
        self.norms_in_projections: frozenset[int] = frozenset()
        # of those, the classes whose post-attention add+RMSNorm runs as its own kernel (ts.POST_NORM_APART)
        self.post_norm_apart: frozenset[int] = frozenset()
        # qkv, o, gate_up, down: row class -> the weight in that class's tile order (ts.pack), where packed
        self.packed: tuple[dict[int, torch.Tensor], ...] = ({}, {}, {}, {})
        # every copy ever made, by (projection, row class, config): reused when asked again, never freed
        # (a graph captured with one keeps reading it after the settings change)
        self.packed_copies: dict[tuple[int, int, ts.Config], torch.Tensor] = {}

    def forward(self, x: torch.Tensor, rope: RopeFactors, attn: AttentionFn) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, attn)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_fused(self, x: Optional[torch.Tensor], residual: Optional[torch.Tensor], positions: torch.Tensor,
                      rope: RotaryEmbedding, attn: AttentionFn, sumsq: Optional[torch.Tensor] = None
                      ) -> tuple[Optional[torch.Tensor], torch.Tensor, Optional[torch.Tensor]]:
        """Residual stream kept separately so each add fuses into the next RMSNorm (same rounding).

        The stream between layers is (x, residual, sumsq): x the last sublayer's output still to be
        added to ``residual`` (None for the first layer's embeddings, which are ``x``), or, at row
        classes in ``norms_in_projections``, x None and ``residual`` already summed by the down
        projection, with its rows' squares as slab partials ``sumsq`` (``ts.skinny_add``)."""
        ln, sa, mlp, pln = self.input_layernorm, self.self_attn, self.mlp, self.post_attention_layernorm
        rows = (residual if x is None else x).shape[0]
        cls = ts.row_class(rows)
        if sumsq is not None:
            assert residual is not None
            h, norm = residual, ts.NormInput(sumsq, ln.eps)
        elif residual is None:
            residual, h, norm = x, tk.rms_norm(x, ln.weight, ln.eps), None
        else:
            h, norm = tk.add_rms_norm(x, residual, ln.weight, ln.eps, self.skinny_pdl), None
        attended = sa.attend_fused(self._project(sa.qkv_proj, h, 0, cls, norm=norm), positions, rope, attn)
        norms_in = cls in self.norms_in_projections
        if norms_in and cls not in self.post_norm_apart:  # o adds into the residual, gate|up normalises it
            sumsq = self._project_add(sa.o_proj, attended, 1, cls, residual)
            gu = self._project(mlp.gate_up_proj, residual, 2, cls, silu_mul=True,
                               norm=ts.NormInput(sumsq, pln.eps))
        else:
            h = tk.add_rms_norm(self._project(sa.o_proj, attended, 1, cls), residual, pln.weight, pln.eps,
                                self.skinny_pdl)
            gu = self._project(mlp.gate_up_proj, h, 2, cls, silu_mul=True)
        if norms_in:  # down adds into the residual, the next layer's q|k|v normalises it
            return None, residual, self._project_add(mlp.down_proj, gu, 3, cls, residual)
        return self._project(mlp.down_proj, gu, 3, cls), residual, None

    def _project(self, proj: nn.Linear, x: torch.Tensor, i: int, cls: Optional[int],
                 silu_mul: bool = False, norm: Optional[ts.NormInput] = None) -> torch.Tensor:
        """``proj(x)`` (then SiLU·mul of its [gate | up] halves), of RMSNorm(x) with ``norm`` (only at
        ``norms_in_projections`` row classes): on the skinny GEMM where it won at this many rows, else
        cuBLAS (and the SiLU·mul kernel). ``i``: which of the layer's projections (qkv, o, gate_up, down)."""
        cfg = self.skinny[i].get(cls)  # no config for None: outside the skinny GEMM's rows
        if cfg is not None:
            w, packed = self._weight(i, proj, cls)
            return ts.skinny(x, w, silu_mul=silu_mul, config=cfg, pdl=self.skinny_pdl, norm=norm, packed=packed)
        plain = self.skinny_gate_up_plain.get(cls) if silu_mul else None
        assert norm is None or plain is not None, "a norm rides only in the skinny GEMM"
        if plain is not None:
            y = ts.skinny(x, proj.weight, config=plain, pdl=self.skinny_pdl, norm=norm)
        else:
            y = proj(x)
        return tk.silu_and_mul(y, self.silu_pdl) if silu_mul else y

    def _project_add(self, proj: nn.Linear, x: torch.Tensor, i: int, cls: Optional[int],
                     residual: torch.Tensor) -> torch.Tensor:
        """``residual += proj(x)`` on the skinny GEMM (``ts.skinny_add``) for projection ``i`` (o or down)
        at a row class with the norms in the projections; returns the rows' squares as slab partials."""
        w, packed = self._weight(i, proj, cls)
        return ts.skinny_add(x, w, residual, config=self.skinny[i][cls], pdl=self.skinny_pdl, packed=packed)

    def _weight(self, i: int, proj: nn.Linear, cls: Optional[int]) -> tuple[torch.Tensor, bool]:
        """Projection ``i``'s (qkv, o, gate_up, down) weight for a skinny launch at row class ``cls``:
        its packed copy if it has one there, else the weight; and whether it is packed."""
        w = self.packed[i].get(cls)
        return (proj.weight, False) if w is None else (w, True)

    @torch.no_grad()
    def fold_norm_weights(self) -> None:
        """Fold each RMSNorm's weight into the fused projection after it (its input columns), leaving
        the norms' weights at one, so a projection can take RMSNorm(x) as x times a per-row scale
        applied to its sums (``ts.NormInput``): the skinny GEMM's K loop stays the plain one. Every
        fused path (GEMV, skinny, cuBLAS) runs on the folded weights, so their numerics agree with
        each other; against HF's bf16 the rounding moves from the normalised activations to the
        weights (one bf16 rounding of W * w instead of one of w * x), an ulp-level change of the same size."""
        for norm, proj in ((self.input_layernorm, self.self_attn.qkv_proj),
                           (self.post_attention_layernorm, self.mlp.gate_up_proj)):
            proj.weight.mul_(norm.weight.to(proj.weight.dtype)[None, :])
            norm.weight.fill_(1.0)

    def set_skinny(self, enabled: bool, policy: str, packed: bool = False) -> None:
        """Which projections take the skinny GEMM at 2-64 rows: plain bias-free ``nn.Linear`` ones (a
        tensor-parallel row shard all-reduces in its forward) whose shape has a measured win in
        ``ts.TUNED``. It launches with PDL unless the policy is "off": its weight tile is requested
        before the wait whatever the weight size (bench/skinny_bench.py measured it with PDL); so do
        the layer's add+RMSNorms, which let the projection after them launch at once. ``packed``: at
        ``ts.PACKED`` row classes the projections read copies of their weights in tile order (``ts.pack``)."""
        sa, mlp = self.self_attn, self.mlp

        def eligible(p: nn.Module) -> bool:
            return enabled and type(p) is nn.Linear and p.bias is None

        projs = ((sa.qkv_proj, False), (sa.o_proj, False), (mlp.gate_up_proj, True), (mlp.down_proj, False))
        self.skinny = tuple(ts.configs_for(*p.weight.shape, silu) if eligible(p) else {} for p, silu in projs)
        self.skinny_pdl = enabled and tk.use_pdl(sa.qkv_proj.weight.device, 0, policy)
        gu = mlp.gate_up_proj
        self.skinny_gate_up_plain = {
            c: cfg for c, cfg in ts.configs_for(*gu.weight.shape).items() if c not in self.skinny[2]
        } if eligible(gu) else {}
        # the SiLU·mul kernel after a gate|up without the fused epilogue lets the skinny down start early too
        self.silu_pdl = self.skinny_pdl and tk.SILU_MUL_PDL
        # the norms ride in the projections where all four take the skinny GEMM (o and down add into the
        # residual, q|k|v and gate|up normalise it) unless measured slower there (ts.NORMS_APART)
        qkv, o, gate_up, down = self.skinny
        hidden = sa.o_proj.weight.shape[0]
        self.norms_in_projections = frozenset(
            c for c in ts.ROW_CLASSES
            if ts.NORMS_IN_PROJECTIONS and (hidden, c) not in ts.NORMS_APART and c in qkv and c in o
            and c in down and (c in gate_up or c in self.skinny_gate_up_plain))
        self.post_norm_apart = frozenset(c for c in self.norms_in_projections if (hidden, c) in ts.POST_NORM_APART)
        self.packed = tuple({c: self._packed_copy(i, c, cfg, p, silu) for c, cfg in configs.items()
                             if packed and ts.packs(hidden, c, cfg)}
                            for i, ((p, silu), configs) in enumerate(zip(projs, self.skinny)))

    def _packed_copy(self, i: int, cls: int, cfg: ts.Config, proj: nn.Linear, silu: bool) -> torch.Tensor:
        """Projection ``i``'s weight in ``cfg``'s tile order, made once per (projection, class, config)."""
        key = (i, cls, cfg)
        if key not in self.packed_copies:
            self.packed_copies[key] = ts.pack(proj.weight.detach(), cfg, silu)
        return self.packed_copies[key]

    def set_pdl(self, policy: str) -> None:
        """Decide once, per projection, whether its fused GEMV launches with PDL
        (``triton_kernels.use_pdl``), so no launch re-evaluates the policy; and whether a gate|up left
        without PDL lets the down projection after it start early (``triton_gemv.TRIGGER_NEXT``)."""
        sa, mlp = self.self_attn, self.mlp
        self.gemv_pdl = tuple(
            tk.use_pdl(w.device, w.numel() * w.element_size(), policy)
            for w in (sa.qkv_proj.weight, sa.o_proj.weight, mlp.gate_up_proj.weight, mlp.down_proj.weight)
        )
        self.gate_up_trigger = self.gemv_pdl[3] and not self.gemv_pdl[2] and tg.TRIGGER_NEXT

    def forward_small(self, h: torch.Tensor, positions: torch.Tensor, rope: RotaryEmbedding,
                      attn: AttentionFn) -> None:
        """Decode at <= ``tg.MAX_M`` rows: 7 launches instead of 10. ``h`` is the residual stream,
        updated in place: RMSNorms ride in the GEMV prologues, residual adds in the epilogues."""
        ln, sa, pln, mlp = self.input_layernorm, self.self_attn, self.post_attention_layernorm, self.mlp
        pdl_qkv, pdl_o, pdl_gu, pdl_down = self.gemv_pdl
        qkv = tg.gemv(h, sa.qkv_proj.weight, sa.qkv_proj.bias, norm_weight=ln.weight, eps=ln.eps, pdl=pdl_qkv)
        o = sa.attend_fused(qkv, positions, rope, attn)
        _gemv_add(sa.o_proj, o, h, pdl_o)
        gu = tg.gemv(h, mlp.gate_up_proj.weight, mlp.gate_up_proj.bias, norm_weight=pln.weight, eps=pln.eps,
                     pdl=pdl_gu, trigger=self.gate_up_trigger)
        _gemv_add(mlp.down_proj, gu, h, pdl_down, silu_mul=True)


def _gemv_add(proj: nn.Linear, x: torch.Tensor, h: torch.Tensor, pdl: bool, silu_mul: bool = False) -> None:
    """``h += proj(x)`` in place, the residual add in the GEMV's epilogue. A projection may bring its
    own (a tensor-parallel row shard adds its partial sum and all-reduces: models/parallel/layers.py)."""
    own = getattr(proj, "gemv_add", None)
    if own is not None:
        own(x, h, pdl, silu_mul)
    else:
        tg.gemv(x, proj.weight, proj.bias, silu_mul=silu_mul, residual=h, out=h, pdl=pdl)


@dataclass(frozen=True)
class PreNorm:
    """The residual stream before the final RMSNorm: ``residual``, plus ``x``, a last sublayer output not
    yet added to it (the fused path's stream), or, where the last down projection added into it on the
    skinny GEMM, ``sumsq``, its rows' squares as slab partials (``ts.NormInput``: a skinny lm_head then
    normalises in its own epilogue)."""

    residual: torch.Tensor
    x: Optional[torch.Tensor] = None
    sumsq: Optional[torch.Tensor] = None


class DecoderModel(nn.Module):
    """The `model.` prefix of HF checkpoints: embeddings, layers, final norm, shared rope."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(spec, i) for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(spec)
        self.fused = False
        self.gemv_max_rows = 0  # fused path: batches up to this many tokens take the Triton GEMV layers
        self.before_layer: Optional[Callable[[], None]] = None
        """Called before each layer when set: lets a background forward (the engine's parity re-run)
        pace itself between layers; it decides itself which threads it holds back."""

    def gemv_rows(self, rows: int) -> bool:
        """Whether a forward of ``rows`` tokens runs the fused-GEMV layers (``forward_small``)."""
        return self.fused and rows <= self.gemv_max_rows

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionFn) -> torch.Tensor:
        """Hidden states after the final RMSNorm."""
        return self.final_norm(self.forward_pre_norm(input_ids, positions, attn))

    def forward_pre_norm(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionFn) -> PreNorm:
        """The residual stream before the final RMSNorm, which the caller applies (``final_norm``) or
        leaves to the lm_head's kernel (``DecoderForCausalLM.decode_logits``)."""
        x = self.embed_tokens(input_ids)
        pace = self.before_layer
        if self.gemv_rows(x.shape[0]):
            for layer in self.layers:
                if pace is not None:
                    pace()
                layer.forward_small(x, positions, self.rotary_emb, attn)
            return PreNorm(x)
        if self.fused:
            stream: tuple[Optional[torch.Tensor], Optional[torch.Tensor], Optional[torch.Tensor]] = (x, None, None)
            for layer in self.layers:
                if pace is not None:
                    pace()
                stream = layer.forward_fused(*stream[:2], positions, self.rotary_emb, attn, sumsq=stream[2])
            x, residual, sumsq = stream
            assert residual is not None
            return PreNorm(residual, x, sumsq)
        rope = self.rotary_emb.factors(positions, x.dtype)
        for layer in self.layers:
            if pace is not None:
                pace()
            x = layer(x, rope, attn)
        return PreNorm(x)

    def final_norm(self, pre: PreNorm) -> torch.Tensor:
        """The final RMSNorm of ``pre`` (after its pending add), by the path that produced it."""
        if not self.fused:
            assert pre.x is None
            return self.norm(pre.residual)
        if pre.x is None:  # the last down projection added into the residual already
            return tk.rms_norm(pre.residual, self.norm.weight, self.norm.eps)
        return tk.add_rms_norm(pre.x, pre.residual, self.norm.weight, self.norm.eps)


class DecoderForCausalLM(nn.Module):
    """forward(input_ids [T], positions [T], attn) -> hidden [T, hidden]; compute_logits -> logits in the
    model's dtype."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.model = DecoderModel(spec)
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        self.tie_weights()
        self.lm_head_pdl = False  # the lm_head GEMV launches with PDL (enable_fused_kernels)
        self.logits_pdl = False  # the step's tail (skinny lm_head, argmax) launches with PDL (enable_fused_kernels)
        # row class -> skinny-GEMM config of the lm_head, the final norm's weight folded into it (enable_fused_kernels)
        self.lm_head_skinny: dict[int, ts.Config] = {}

    def tie_weights(self) -> None:
        """Share lm_head with the embeddings when the config says so.

        Must be re-run after anything that replaces parameters (e.g. `to_empty` from meta).
        """
        if self.spec.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def fused_kernels(self) -> bool:
        return self.model.fused

    @property
    def fused_gemv_rows(self) -> int:
        """Steps of at most this many tokens run the fused-GEMV layers (0: never)."""
        return self.model.gemv_max_rows if self.model.fused else 0

    def enable_fused_kernels(self, gemv_max_rows: int = 1, *, gemv: bool = True, pdl: str = "auto",
                             skinny: bool = True, packed: bool = False) -> bool:
        """Switch to fused weights (qkv, gate_up) and Triton kernels when the device allows it.

        Only for CUDA bf16/fp16 with Triton; returns whether the fused path is now on. Batches of at
        most ``gemv_max_rows`` tokens (0 = never) use the fused-GEMV layers, unless ``gemv`` is False;
        ``pdl`` is their launch policy (the engine's ``KernelConfig``); ``skinny``: batches of 2-64
        tokens may take the skinny GEMM (``DecoderLayer.set_skinny``), ``packed`` on weight copies in its
        tile order at the row classes that measured faster so. Calling it again only updates those settings.
        """
        p = self.model.embed_tokens.weight
        if not tk.available(p.device, p.dtype):
            return self.model.fused
        self.model.gemv_max_rows = min(gemv_max_rows, tg.MAX_M) if gemv else 0
        if not self.model.fused:
            for layer in self.model.layers:
                layer.self_attn.fuse()
                layer.mlp.fuse()
                layer.fold_norm_weights()
            self._fold_final_norm()
            self.model.fused = True
        for layer in self.model.layers:
            layer.set_pdl(pdl)
            layer.set_skinny(skinny, pdl, packed)
        w = self.lm_head.weight
        self.lm_head_pdl = tk.use_pdl(w.device, w.numel() * w.element_size(), pdl)
        self.logits_pdl = tk.use_pdl(w.device, 0, pdl)
        folded = bool((self.model.norm.weight == 1).all())
        self.lm_head_skinny = ts.configs_for(*w.shape) if skinny and folded and self._plain_lm_head() else {}
        return True

    def packed_copy_bytes(self) -> int:
        """The most GPU memory ``enable_fused_kernels(packed=True)`` may add: a copy of every decoder
        layer's projection weights for each row class ``ts.PACKED`` lists for this hidden size (the
        skinny GEMM's tables decide which projections are copied)."""
        classes = sum(1 for h, _ in ts.PACKED if h == self.spec.hidden_size)
        return classes * sum(p.numel() * p.element_size() for layer in self.model.layers
                             for m in (layer.self_attn, layer.mlp) for p in m.parameters() if p.dim() == 2)

    def packed_rows(self) -> list[tuple[int, int]]:
        """The batch sizes (fewest, most rows) at which some projection reads a packed weight copy now."""
        classes = {c for layer in self.model.layers for by_class in layer.packed for c in by_class}
        return [ts.class_rows(c) for c in sorted(classes)]

    def packed_bytes(self) -> int:
        """GPU memory the layers' packed weight copies hold (every copy made, in use or kept for a graph)."""
        return sum(w.numel() * w.element_size() for layer in self.model.layers for w in layer.packed_copies.values())

    def _plain_lm_head(self) -> bool:
        """An unsharded, bias-free lm_head (a vocab-parallel one gathers in its own forward)."""
        return type(self.lm_head) is nn.Linear and self.lm_head.bias is None

    @torch.no_grad()
    def _fold_final_norm(self) -> None:
        """Fold the final RMSNorm's weight into an untied lm_head, as ``DecoderLayer.fold_norm_weights``
        does for the layers' projections, so a skinny lm_head can take the norm as a per-row scale
        (``ts.NormInput``). A tied head is the embedding table too and keeps the norm's weight."""
        if self.spec.tie_word_embeddings or not self._plain_lm_head():
            return
        self.lm_head.weight.mul_(self.model.norm.weight.to(self.lm_head.weight.dtype)[None, :])
        self.model.norm.weight.fill_(1.0)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionFn) -> torch.Tensor:
        return self.model(input_ids, positions, attn)

    def gemv_logits(self, rows: int) -> bool:
        """Whether a decode step of ``rows`` tokens takes its final RMSNorm and lm_head in one GEMV."""
        return tg.LM_HEAD_GEMV and self.model.gemv_rows(rows) and self._plain_lm_head()

    def decode_logits(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionFn,
                      out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits of every row, for a step whose every token is sampled (decode), into ``out`` when given.

        Where the fused kernels allow it, the final RMSNorm rides in the lm_head's own kernel: at the
        fused GEMV's rows in the GEMV's prologue, at the skinny GEMM's (an untied head, its norm weight
        folded in, ``lm_head_skinny``) as the per-row scale of its sums. One launch, PDL-chained, where
        an RMSNorm kernel and cuBLAS (and the memset it adds) each cost a launch gap; and it lets a
        PDL-launched kernel reading the logits (the greedy argmax) start early. Graph and eager decode
        steps both come here, so their logits agree to the bit."""
        rows = input_ids.shape[0]
        gemv = self.gemv_logits(rows)
        cfg = self.lm_head_skinny.get(ts.row_class(rows))  # empty unless the fused kernels are on
        if not gemv and cfg is None:
            return self.compute_logits(self.model(input_ids, positions, attn), out=out)
        pre = self.model.forward_pre_norm(input_ids, positions, attn)
        norm, w = self.model.norm, self.lm_head.weight
        if gemv:
            return tg.gemv(pre.residual, w, norm_weight=norm.weight, eps=norm.eps, out=out, pdl=self.lm_head_pdl,
                           trigger=True)
        if cfg is not None and pre.sumsq is not None:
            return ts.skinny(pre.residual, w, config=cfg, pdl=self.logits_pdl, norm=ts.NormInput(pre.sumsq, norm.eps),
                             out=out)
        return self.compute_logits(self.model.final_norm(pre), out=out)

    def compute_logits(self, hidden: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits for the rows of `hidden` the caller selected (usually each request's last token), in
        the model's dtype (as transformers returns them), into ``out`` when given.

        Not upcast: an argmax of bf16 logits is the argmax of their float copy, and samplers upcast the
        one row they filter. At a few hundred rows the float copy of a 150k vocabulary (a conversion
        kernel, then a copy into a graph's output buffer) was a measurable slice of a decode step.
        """
        if out is not None and type(self.lm_head) is nn.Linear:  # a vocab-parallel head gathers first
            return torch.mm(hidden, self.lm_head.weight.t(), out=out)
        logits = self.lm_head(hidden)
        return logits if out is None else out.copy_(logits)
