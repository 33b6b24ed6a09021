"""Which kernel runs each projection on the fused path (CUDA bf16/fp16 with Triton), and what rides in it.

The decoder's projections stay plain ``nn.Linear`` modules with HF's parameter names (loading is a name ->
parameter copy; a tensor-parallel shard is a subclass); this module decides, per projection and per batch
size, how their products are launched:

* at <= ``gemv.MAX_M`` rows (decode, ``DecoderLayer.forward_small``), the fused GEMV, the RMSNorm in its
  prologue and the residual add in its epilogue (small_layer.py, with the settings decided here); where asked
  for (``KernelConfig.fused_mlp``), the whole MLP in one launch (kernels/fused_mlp.py);
* at 2-64 rows, the skinny GEMM where bench/skinny_bench.py measured it faster than cuBLAS
  (``skinny_tuning.TUNED``), with SiLU·mul in the gate|up epilogue and, where all four of a layer's
  projections take it, the add+RMSNorms inside them (``LayerKernels``); on packed weight copies at the
  row classes ``skinny_tuning.PACKED`` lists;
* elsewhere cuBLAS (``proj(x)``), with the add+RMSNorm and SiLU·mul kernels between.

Every path is deterministic: a graph replays the launches its eager warmup made, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..kernels import fused as tk
from ..kernels import fused_mlp as tm
from ..kernels import gemv as tg
from ..kernels import skinny as ts
from ..kernels import skinny_tuning as st
from ..kernels.skinny_tuning import Config, class_rows, row_class
from .activation import silu_and_mul, silu_mul_pdl
from .norm import PreNorm, RMSNorm, add_norm

__all__ = [
    "DOWN",
    "GATE_UP",
    "QKV",
    "Config",
    "LayerKernels",
    "O_PROJ",
    "Projections",
    "class_rows",
    "fused_kernels_run",
    "gemv_row_limit",
    "lm_head_gemv_on",
    "lm_head_settings",
    "logits_with_norm",
    "one_launch_mlp_for",
    "packed_classes",
    "row_class",
]

Projections = tuple[nn.Linear, nn.Linear, nn.Linear, nn.Linear]
"""A fused decoder layer's projections in the order of ``LayerKernels``' settings: qkv, o, gate_up, down."""
QKV, O_PROJ, GATE_UP, DOWN = range(4)


def fused_kernels_run(weight: torch.Tensor) -> bool:
    """Whether the fused kernels run for a model whose weights are like ``weight`` (CUDA bf16/fp16, Triton)."""
    return tk.available(weight.device, weight.dtype)


def gemv_row_limit(rows: int) -> int:
    """``rows`` capped at the most the fused GEMV handles."""
    return min(rows, tg.MAX_M)


@dataclass
class LayerKernels:
    """One decoder layer's kernel choices, set by ``DecoderLayer.set_pdl`` / ``set_skinny`` once per
    setting, so no launch re-evaluates a policy. Tuples are per projection (qkv, o, gate_up, down)."""

    #: whether each projection's fused GEMV launches with PDL (``set_pdl``)
    gemv_pdl: tuple[bool, ...] = (False, False, False, False)
    #: a plain gate|up GEMV lets the PDL down projection start early (``set_pdl``)
    gate_up_trigger: bool = False
    #: at the fused GEMV's rows the MLP runs in one launch (``set_fused_mlp``), with PDL or not
    fused_mlp: bool = False
    fused_mlp_pdl: bool = False
    #: row class -> skinny-GEMM config where it beat cuBLAS (``set_skinny``)
    skinny: tuple[dict[int, Config], ...] = field(default_factory=lambda: ({}, {}, {}, {}))
    skinny_pdl: bool = False
    silu_pdl: bool = False
    #: row class -> plain skinny config of gate|up where it has no fused SiLU·mul one (SiLU·mul kernel after)
    skinny_gate_up_plain: dict[int, Config] = field(default_factory=dict)
    #: row classes whose add+RMSNorms ride in the skinny projections around them (``set_skinny``)
    norms_in_projections: frozenset[int] = frozenset()
    #: of those, the classes whose post-attention add+RMSNorm runs as its own kernel (``st.POST_NORM_APART``)
    post_norm_apart: frozenset[int] = frozenset()
    #: row class -> the weight in that class's tile order (``skinny.pack``), where packed
    packed: tuple[dict[int, torch.Tensor], ...] = field(default_factory=lambda: ({}, {}, {}, {}))
    #: every copy ever made, by (projection, row class, config): reused when asked again, never freed
    #: (a graph captured with one keeps reading it after the settings change)
    packed_copies: dict[tuple[int, int, Config], torch.Tensor] = field(default_factory=dict)

    def set_pdl(self, projections: Projections, policy: str) -> None:
        """Decide once, per projection, whether its fused GEMV launches with PDL (``fused.use_pdl``);
        and whether a gate|up left without PDL lets the down projection after it start early
        (``gemv.TRIGGER_NEXT``)."""
        self.gemv_pdl = tuple(
            tk.use_pdl(w.device, w.numel() * w.element_size(), policy) for w in (p.weight for p in projections)
        )
        self.gate_up_trigger = self.gemv_pdl[3] and not self.gemv_pdl[2] and tg.TRIGGER_NEXT

    def set_fused_mlp(self, projections: Projections, enabled: bool, policy: str) -> None:
        """Whether the MLP at the fused GEMV's rows runs in one launch (``fused_mlp.fused_mlp``): where
        ``enabled`` and both its projections are plain bias-free ``nn.Linear`` modules (a tensor-parallel
        row shard of down adds its partial sum and all-reduces in its own ``gemv_add``: two launches
        there). It launches with PDL as a GEMV streaming both weights would (``fused.use_pdl``)."""
        _, _, gate_up, down = projections
        self.fused_mlp = enabled and all(type(p) is nn.Linear and p.bias is None for p in (gate_up, down))
        weights = sum(p.weight.numel() * p.weight.element_size() for p in (gate_up, down))
        self.fused_mlp_pdl = self.fused_mlp and tk.use_pdl(gate_up.weight.device, weights, policy)

    def set_skinny(self, projections: Projections, enabled: bool, policy: str, packed: bool = False) -> None:
        """Which projections take the skinny GEMM at 2-64 rows: plain bias-free ``nn.Linear`` ones (a
        tensor-parallel row shard all-reduces in its forward) whose shape has a measured win in
        ``st.TUNED``. It launches with PDL unless the policy is "off": its weight tile is requested
        before the wait whatever the weight size (bench/skinny_bench.py measured it with PDL); so do
        the layer's add+RMSNorms, which let the projection after them launch at once. ``packed``: at
        ``st.PACKED`` row classes the projections read copies of their weights in tile order (``ts.pack``)."""
        qkv_proj, o_proj, gu, down_proj = projections

        def eligible(p: nn.Module) -> bool:
            return enabled and type(p) is nn.Linear and p.bias is None

        projs = ((qkv_proj, False), (o_proj, False), (gu, True), (down_proj, False))
        self.skinny = tuple(st.configs_for(*p.weight.shape, silu) if eligible(p) else {} for p, silu in projs)
        self.skinny_pdl = enabled and tk.use_pdl(qkv_proj.weight.device, 0, policy)
        self.skinny_gate_up_plain = (
            {c: cfg for c, cfg in st.configs_for(*gu.weight.shape).items() if c not in self.skinny[2]}
            if eligible(gu)
            else {}
        )
        # the SiLU·mul kernel after a gate|up without the fused epilogue lets the skinny down start early too
        self.silu_pdl = silu_mul_pdl(self.skinny_pdl)
        # the norms ride in the projections where all four take the skinny GEMM (o and down add into the
        # residual, q|k|v and gate|up normalise it) unless measured slower there (st.NORMS_APART)
        qkv, o, gate_up, down = self.skinny
        hidden = o_proj.weight.shape[0]
        self.norms_in_projections = frozenset(
            c
            for c in st.ROW_CLASSES
            if st.NORMS_IN_PROJECTIONS
            and (hidden, c) not in st.NORMS_APART
            and c in qkv
            and c in o
            and c in down
            and (c in gate_up or c in self.skinny_gate_up_plain)
        )
        self.post_norm_apart = frozenset(c for c in self.norms_in_projections if (hidden, c) in st.POST_NORM_APART)
        self.packed = tuple(
            {
                c: self._packed_copy(i, c, cfg, p, silu)
                for c, cfg in configs.items()
                if packed and st.packs(hidden, c, cfg)
            }
            for i, ((p, silu), configs) in enumerate(zip(projs, self.skinny))
        )

    def _packed_copy(self, i: int, cls: int, cfg: Config, proj: nn.Linear, silu: bool) -> torch.Tensor:
        """Projection ``i``'s weight in ``cfg``'s tile order, made once per (projection, class, config)."""
        key = (i, cls, cfg)
        if key not in self.packed_copies:
            self.packed_copies[key] = ts.pack(proj.weight.detach(), cfg, silu)
        return self.packed_copies[key]

    def project(
        self,
        proj: nn.Linear,
        x: torch.Tensor,
        i: int,
        cls: int | None,
        silu_mul: bool = False,
        norm: ts.NormInput | None = None,
    ) -> torch.Tensor:
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
        return silu_and_mul(y, self.silu_pdl) if silu_mul else y

    def project_add(
        self, proj: nn.Linear, x: torch.Tensor, i: int, cls: int | None, residual: torch.Tensor
    ) -> torch.Tensor:
        """``residual += proj(x)`` on the skinny GEMM (``ts.skinny_add``) for projection ``i`` (o or down)
        at a row class with the norms in the projections; returns the rows' squares as slab partials."""
        w, packed = self._weight(i, proj, cls)
        return ts.skinny_add(x, w, residual, config=self.skinny[i][cls], pdl=self.skinny_pdl, packed=packed)

    def _weight(self, i: int, proj: nn.Linear, cls: int | None) -> tuple[torch.Tensor, bool]:
        """Projection ``i``'s (qkv, o, gate_up, down) weight for a skinny launch at row class ``cls``:
        its packed copy if it has one there, else the weight; and whether it is packed."""
        w = self.packed[i].get(cls)
        return (proj.weight, False) if w is None else (w, True)

    def attention_out_mlp_in(
        self,
        o_proj: nn.Linear,
        attended: torch.Tensor,
        residual: torch.Tensor,
        gate_up_proj: nn.Linear,
        pln: RMSNorm,
        cls: int | None,
    ) -> torch.Tensor:
        """o projection, residual add, post-attention RMSNorm, gate|up and SiLU·mul: silu(gate) * up. At a
        row class with the norms in the projections (and not ``post_norm_apart``) o adds into ``residual``
        and gate|up normalises it; else o, the add+RMSNorm kernel, then gate|up."""
        if cls in self.norms_in_projections and cls not in self.post_norm_apart:
            sumsq = self.project_add(o_proj, attended, O_PROJ, cls, residual)
            return self.project(gate_up_proj, residual, GATE_UP, cls, silu_mul=True, norm=ts.NormInput(sumsq, pln.eps))
        h = add_norm(self.project(o_proj, attended, O_PROJ, cls), residual, pln, self.skinny_pdl)
        return self.project(gate_up_proj, h, GATE_UP, cls, silu_mul=True)

    def mlp_out(
        self, down_proj: nn.Linear, gu: torch.Tensor, residual: torch.Tensor, cls: int | None
    ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
        """The down projection into the stream (x, residual, sumsq) between layers: at a row class with the
        norms in the projections it adds into ``residual`` and the next q|k|v normalises it (x None,
        ``sumsq`` its rows' squares); else x is its output, still to be added."""
        if cls in self.norms_in_projections:
            return None, residual, self.project_add(down_proj, gu, DOWN, cls, residual)
        return self.project(down_proj, gu, DOWN, cls), residual, None


def one_launch_mlp_for(mode: bool | str, hidden: int, intermediate: int) -> bool:
    """Whether the fused-GEMV layers run each MLP in one launch: asked for (True, "on"), or "auto" and the MLP's
    shape measured faster so (``fused_mlp.MEASURED_WINS``)."""
    return mode in (True, "on") or (mode == "auto" and tm.measured_win(hidden, intermediate))


def packed_classes(hidden: int) -> int:
    """How many row classes read packed weight copies, when asked for, in a model of this hidden size."""
    return sum(1 for h, _ in st.PACKED if h == hidden)


def lm_head_settings(weight: torch.Tensor, policy: str, skinny: bool) -> tuple[bool, bool, dict[int, Config]]:
    """An lm_head's launch settings: whether its GEMV launches with PDL, whether the step's tail (skinny
    lm_head, argmax) does, and row class -> skinny config (``skinny``: it may take the skinny GEMM)."""
    return (
        tk.use_pdl(weight.device, weight.numel() * weight.element_size(), policy),
        tk.use_pdl(weight.device, 0, policy),
        st.configs_for(*weight.shape) if skinny else {},
    )


def lm_head_gemv_on() -> bool:
    """Whether the fused-GEMV rows take the final RMSNorm and lm_head in one GEMV (``gemv.LM_HEAD_GEMV``)."""
    return tg.LM_HEAD_GEMV


def logits_with_norm(
    pre: PreNorm,
    norm: RMSNorm,
    weight: torch.Tensor,
    *,
    gemv: bool,
    config: Config | None,
    gemv_pdl: bool,
    tail_pdl: bool,
    out: torch.Tensor | None,
) -> torch.Tensor | None:
    """The logits with the final RMSNorm in the lm_head's own kernel: the fused GEMV's prologue (``gemv``),
    or the skinny GEMM's per-row scale (``config``, where the stream's last down projection left its rows'
    squares); None where neither applies."""
    if gemv:
        return tg.gemv(pre.residual, weight, norm_weight=norm.weight, eps=norm.eps, out=out, pdl=gemv_pdl, trigger=True)
    if config is not None and pre.sumsq is not None:
        return ts.skinny(
            pre.residual, weight, config=config, pdl=tail_pdl, norm=ts.NormInput(pre.sumsq, norm.eps), out=out
        )
    return None
