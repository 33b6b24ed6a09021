"""The decoder every family builds on (models/families/): embeddings, layers, final norm, lm_head.

The model sees a flat ragged batch of tokens (requests concatenated, no batch dim) and
their absolute `positions`; attention over the KV cache is delegated to the engine's
`attn` callable, which is the only thing that leaves the model. That keeps the module
free of padding, caches and batch logic, and keeps `forward` CUDA-graph capturable: no
host syncs, no value-dependent control flow, all shapes derived from input shapes.

Parameter names equal HF checkpoint names, so loading is a name -> parameter copy (a family whose
checkpoints store some weights fused maps them: ``Family.stored``). This file is the model's structure: a
family swaps the layer and norm classes (``DecoderForCausalLM.layer_cls``, ``norm_cls``), and the numerics
its spec carries (embedding scale, logit soft cap, a second RoPE table) are applied here. On the fused path
(CUDA bf16/fp16 with Triton) which kernel runs each norm, projection and activation is decided in
models/layers/ (norm.py, linear.py, activation.py, rope.py), the kernels themselves are in models/kernels/.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Callable, ClassVar, Optional

import torch
from torch import nn

from .layers.attention import Attention, AttentionFn
from .layers.fused_support import spec_problem
from .layers.linear import (
    QKV,
    Config,
    LayerKernels,
    Projections,
    class_rows,
    fused_kernels_run,
    gemv_row_limit,
    lm_head_gemv_on,
    lm_head_settings,
    logits_with_norm,
    one_launch_mlp_for,
    packed_classes,
    row_class,
)
from .layers.mlp import GatedMLP
from .layers.moe import expert_banks
from .layers.norm import PreNorm, RMSNorm, final_norm, fold_norm, fused_input_norm
from .layers.rope import RopeFactors, RotaryEmbedding
from .layers.small_layer import Projection, SmallLayer, norm_of
from .spec import ModelSpec

__all__ = ["Attention", "AttentionFn", "DecoderForCausalLM", "DecoderLayer", "DecoderModel"]
log = logging.getLogger(__name__)


class DecoderLayer(nn.Module):
    """The pre-norm block (Llama, Mistral, Qwen, Phi-3): x + attn(norm(x)), then x + mlp(norm(x)). The one
    block the fused kernels run (``forward_fused``, ``forward_small``)."""

    def __init__(self, spec: ModelSpec, layer_id: int, norm_cls: type[nn.Module] = RMSNorm) -> None:
        super().__init__()
        self.input_layernorm = norm_cls(spec.hidden_size, spec.rms_norm_eps)
        self.self_attn = Attention(spec, layer_id, norm_cls)
        self.post_attention_layernorm = norm_cls(spec.hidden_size, spec.rms_norm_eps)
        self.mlp = GatedMLP(spec.hidden_size, spec.intermediate_size, spec.mlp_bias, spec.hidden_act)
        #: which kernel each projection takes on the fused path, per row class (set_pdl, set_skinny)
        self.kernels = LayerKernels()
        #: the fused-GEMV forward with what it reads looked up once (``bind_small``); None: bind at next use
        self.small: Optional[SmallLayer] = None

    def forward(self, x: torch.Tensor, rope: RopeFactors, attn: AttentionFn) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, attn)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_fused(
        self,
        x: Optional[torch.Tensor],
        residual: Optional[torch.Tensor],
        positions: torch.Tensor,
        rope: RotaryEmbedding,
        attn: AttentionFn,
        sumsq: Optional[torch.Tensor] = None,
    ) -> tuple[Optional[torch.Tensor], torch.Tensor, Optional[torch.Tensor]]:
        """Residual stream kept separately so each add fuses into the next RMSNorm (same rounding).

        The stream between layers is (x, residual, sumsq): x the last sublayer's output still to be
        added to ``residual`` (None for the first layer's embeddings, which are ``x``), or, at row
        classes in ``norms_in_projections``, x None and ``residual`` already summed by the down
        projection, with its rows' squares as slab partials ``sumsq`` (``LayerKernels.mlp_out``)."""
        k, sa, mlp = self.kernels, self.self_attn, self.mlp
        cls = row_class((residual if x is None else x).shape[0])
        h, residual, norm = fused_input_norm(x, residual, sumsq, self.input_layernorm, k.skinny_pdl)
        attended = sa.attend_fused(k.project(sa.qkv_proj, h, QKV, cls, norm=norm), positions, rope, attn)
        gu = k.attention_out_mlp_in(sa.o_proj, attended, residual, mlp.gate_up_proj, self.post_attention_layernorm, cls)
        return k.mlp_out(mlp.down_proj, gu, residual, cls)

    def projections(self) -> Projections:
        """The fused path's projections (after ``fuse``), in ``LayerKernels``' order: qkv, o, gate_up, down."""
        sa, mlp = self.self_attn, self.mlp
        return sa.qkv_proj, sa.o_proj, mlp.gate_up_proj, mlp.down_proj

    def fold_norm_weights(self) -> None:
        """Fold each RMSNorm's weight into the fused projection after it (``norm.fold_norm``), leaving the
        norms' weights at one, so a skinny projection can take RMSNorm(x) as a per-row scale of its sums."""
        fold_norm(self.input_layernorm, self.self_attn.qkv_proj)
        fold_norm(self.post_attention_layernorm, self.mlp.gate_up_proj)

    def set_skinny(self, enabled: bool, policy: str, packed: bool = False) -> None:
        """Which projections take the skinny GEMM at 2-64 rows, with which launch policy, on packed weight
        copies or not (``LayerKernels.set_skinny``)."""
        self.kernels.set_skinny(self.projections(), enabled, policy, packed)

    def set_pdl(self, policy: str) -> None:
        """Whether each projection's fused GEMV launches with PDL (``LayerKernels.set_pdl``)."""
        self.kernels.set_pdl(self.projections(), policy)
        self.small = None

    def set_fused_mlp(self, enabled: bool, policy: str) -> None:
        """Whether the MLP at the fused GEMV's rows runs in one launch (``LayerKernels.set_fused_mlp``)."""
        self.kernels.set_fused_mlp(self.projections(), enabled, policy)
        self.small = None

    def bind_small(self) -> SmallLayer:
        """The fused-GEMV forward over this layer's parameters and current kernel settings."""
        qkv, o, gate_up, down = (Projection.of(p) for p in self.projections())
        k = self.kernels
        self.small = SmallLayer(
            qkv,
            o,
            gate_up,
            down,
            norm_of(self.input_layernorm),
            norm_of(self.post_attention_layernorm),
            self.self_attn.attend_fused,
            k.gemv_pdl,
            k.gate_up_trigger,
            k.fused_mlp,
            k.fused_mlp_pdl,
        )
        return self.small

    def forward_small(self, h: torch.Tensor, positions: torch.Tensor, rope: RotaryEmbedding, attn: AttentionFn) -> None:
        """Decode at <= ``gemv.MAX_M`` rows: 5 launches with the one-launch decode attention (4 with the MLP
        in one launch too, ``LayerKernels.fused_mlp``). ``h`` is the residual stream, updated in place:
        RMSNorms ride in the GEMV prologues, residual adds in the epilogues (models/layers/small_layer.py)."""
        (self.small or self.bind_small()).forward(h, positions, rope, attn)


class DecoderModel(nn.Module):
    """The `model.` prefix of HF checkpoints: embeddings, layers, final norm, shared rope (and the sliding
    layers' own, ``local_rotary_emb``, where the family has one: Gemma 3)."""

    def __init__(
        self, spec: ModelSpec, layer_cls: type[nn.Module] = DecoderLayer, norm_cls: type[nn.Module] = RMSNorm
    ) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(layer_cls(spec, i, norm_cls) for i in range(spec.num_layers))
        self.norm = norm_cls(spec.hidden_size, spec.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(spec)
        self.local_rotary_emb: Optional[RotaryEmbedding] = None
        if spec.local_rope_theta is not None:  # the whole context's length: the global table's
            local = replace(spec, rope_theta=spec.local_rope_theta, rope_scaling=spec.local_rope_scaling)
            self.local_rotary_emb = RotaryEmbedding(replace(local, max_position_embeddings=spec.max_context_len))
        #: per layer, 1 where it rotates with ``local_rotary_emb``, else 0 (an index into ``_ropes``)
        self.rope_of = [int(spec.local_rope(i)) for i in range(spec.num_layers)]
        #: the embeddings' scale as transformers holds it (a float32 value, rounded to the model's dtype in use)
        self.embed_scale = None if spec.embed_scale is None else float(torch.tensor(spec.embed_scale, device="cpu"))
        self.fused = False
        self.gemv_max_rows = 0  # fused path: batches up to this many tokens take the Triton GEMV layers
        self.before_layer: Optional[Callable[[], None]] = None
        """Called before each layer when set: lets a background forward (the engine's parity re-run)
        pace itself between layers; it decides itself which threads it holds back."""

    def reset_rope_cache(self, device: torch.device | str | None = None) -> None:
        """Rebuild the RoPE tables (non-persistent: after ``to_empty`` from meta, they hold garbage)."""
        for rope in self._ropes():
            rope.reset_cache(device)

    def _ropes(self) -> list[RotaryEmbedding]:
        return [self.rotary_emb] if self.local_rotary_emb is None else [self.rotary_emb, self.local_rotary_emb]

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The embeddings, times the family's scale where it has one: a 0-d tensor of the embeddings' dtype,
        as transformers multiplies (a Python float would multiply at float32 precision in bf16)."""
        x = self.embed_tokens(input_ids)
        return x if self.embed_scale is None else x * x.new_full((), self.embed_scale)

    def gemv_rows(self, rows: int) -> bool:
        """Whether a forward of ``rows`` tokens runs the fused-GEMV layers (``forward_small``)."""
        return self.fused and rows <= self.gemv_max_rows

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionFn) -> torch.Tensor:
        """Hidden states after the final RMSNorm."""
        return self.final_norm(self.forward_pre_norm(input_ids, positions, attn))

    def forward_pre_norm(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionFn) -> PreNorm:
        """The residual stream before the final RMSNorm, which the caller applies (``final_norm``) or
        leaves to the lm_head's kernel (``DecoderForCausalLM.decode_logits``)."""
        x = self.embed(input_ids)
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
        ropes = [rope.factors(positions, x.dtype) for rope in self._ropes()]
        for layer, r in zip(self.layers, self.rope_of):
            if pace is not None:
                pace()
            x = layer(x, ropes[r], attn)
        return PreNorm(x)

    def final_norm(self, pre: PreNorm) -> torch.Tensor:
        """The final RMSNorm of ``pre`` (after its pending add), by the path that produced it."""
        return final_norm(self.norm, pre, self.fused)


class DecoderForCausalLM(nn.Module):
    """forward(input_ids [T], positions [T], attn) -> hidden [T, hidden]; compute_logits -> logits in the
    model's dtype.

    A family whose layers are not the pre-norm RMSNorm block subclasses it in its own file and sets
    ``layer_cls`` and ``norm_cls`` (Gemma: models/families/gemma2.py); such a model, or one whose numerics the
    fused kernels do not implement (``fused_kernels_problem``), runs on the torch layers on every device."""

    #: the decoder layer, built as ``layer_cls(spec, layer_id, norm_cls)``
    layer_cls: ClassVar[type[nn.Module]] = DecoderLayer
    #: the RMSNorm of every layer and of the final norm
    norm_cls: ClassVar[type[nn.Module]] = RMSNorm

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.model = DecoderModel(spec, self.layer_cls, self.norm_cls)
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        self.tie_weights()
        self.lm_head_pdl = False  # the lm_head GEMV launches with PDL (enable_fused_kernels)
        self.logits_pdl = False  # the step's tail (skinny lm_head, argmax) launches with PDL (enable_fused_kernels)
        # row class -> skinny-GEMM config of the lm_head, the final norm's weight folded into it (enable_fused_kernels)
        self.lm_head_skinny: dict[int, Config] = {}

    def tie_weights(self) -> None:
        """Share lm_head with the embeddings when the config says so, and make every expert's parameters
        views of its layer's stacked expert weights (``layers.experts.ExpertBank``).

        Must be re-run after anything that replaces parameters (e.g. `to_empty` from meta).
        """
        if self.spec.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        for bank in expert_banks(self):  # experts' parameters as views of their stacked weights again
            bank.stack()

    @property
    def fused_kernels(self) -> bool:
        return self.model.fused

    @property
    def fused_gemv_rows(self) -> int:
        """Steps of at most this many tokens run the fused-GEMV layers (0: never)."""
        return self.model.gemv_max_rows if self.model.fused else 0

    def enable_fused_kernels(
        self,
        gemv_max_rows: int = 1,
        *,
        gemv: bool = True,
        pdl: str = "auto",
        skinny: bool = True,
        packed: bool = False,
        fused_mlp: bool | str = False,
    ) -> bool:
        """Switch to fused weights (qkv, gate_up) and Triton kernels when the device allows it.

        Only for CUDA bf16/fp16 with Triton; returns whether the fused path is now on. Batches of at
        most ``gemv_max_rows`` tokens (0 = never) use the fused-GEMV layers, unless ``gemv`` is False;
        ``pdl`` is their launch policy (the engine's ``KernelConfig``); ``skinny``: batches of 2-64
        tokens may take the skinny GEMM (``DecoderLayer.set_skinny``), ``packed`` on weight copies in its
        tile order at the row classes that measured faster so; ``fused_mlp``: the fused-GEMV layers run each
        MLP in one launch (``DecoderLayer.set_fused_mlp``): True or "on", or "auto" for the MLP shapes where it
        measured faster (``fused_mlp.MEASURED_WINS``). Calling it again only updates those settings.
        """
        if not fused_kernels_run(self.model.embed_tokens.weight):
            return self.model.fused
        problem = self.fused_kernels_problem()
        if problem is not None:
            log.warning("%s runs on the torch layers, not the fused kernels: %s", self.spec.architecture, problem)
            return False
        self.model.gemv_max_rows = gemv_row_limit(gemv_max_rows) if gemv else 0
        if not self.model.fused:
            for layer in self.model.layers:
                layer.self_attn.fuse()
                layer.mlp.fuse()
                layer.fold_norm_weights()
            self._fold_final_norm()
            self.model.fused = True
        one_launch_mlp = one_launch_mlp_for(fused_mlp, self.spec.hidden_size, self.spec.intermediate_size)
        for layer in self.model.layers:
            layer.set_pdl(pdl)
            layer.set_fused_mlp(one_launch_mlp, pdl)
            layer.set_skinny(skinny, pdl, packed)
        folded = bool((self.model.norm.weight == 1).all())
        self.lm_head_pdl, self.logits_pdl, self.lm_head_skinny = lm_head_settings(
            self.lm_head.weight, pdl, skinny and folded and self._plain_lm_head()
        )
        return True

    def fused_kernels_problem(self) -> Optional[str]:
        """Why the fused kernels cannot run this model (one line), or None: they run the pre-norm RMSNorm
        block with SiLU, one full-width RoPE table and plain logits alone."""
        if self.layer_cls is not DecoderLayer or self.norm_cls is not RMSNorm:
            return (
                f"its layers ({self.layer_cls.__name__}, {self.norm_cls.__name__}) are not the pre-norm RMSNorm block"
            )
        return spec_problem(self.spec)

    def fused_mlp_layers(self) -> int:
        """How many decoder layers run their MLP in one launch at the fused GEMV's rows (0 where not asked
        for, not on the fused-GEMV layers, or the MLPs are biased or sharded by rows)."""
        return sum(layer.kernels.fused_mlp for layer in self.model.layers) if self.fused_gemv_rows else 0

    def packed_copy_bytes(self) -> int:
        """The most GPU memory ``enable_fused_kernels(packed=True)`` may add: a copy of every decoder
        layer's projection weights for each row class ``skinny_tuning.PACKED`` lists for this hidden size (the
        skinny GEMM's tables decide which projections are copied); none for a model the fused kernels do not
        run (``fused_kernels_problem``: Gemma's sandwich, a mixture of experts, ...)."""
        if self.fused_kernels_problem() is not None:
            return 0
        classes = packed_classes(self.spec.hidden_size)
        return classes * sum(
            p.numel() * p.element_size()
            for layer in self.model.layers
            for m in (layer.self_attn, layer.mlp)
            for p in m.parameters()
            if p.dim() == 2
        )

    def packed_rows(self) -> list[tuple[int, int]]:
        """The batch sizes (fewest, most rows) at which some projection reads a packed weight copy now."""
        classes = {c for layer in self.model.layers for by_class in layer.kernels.packed for c in by_class}
        return [class_rows(c) for c in sorted(classes)]

    def packed_bytes(self) -> int:
        """GPU memory the layers' packed weight copies hold (every copy made, in use or kept for a graph)."""
        return sum(
            w.numel() * w.element_size() for layer in self.model.layers for w in layer.kernels.packed_copies.values()
        )

    def _plain_lm_head(self) -> bool:
        """An unsharded, bias-free lm_head (a vocab-parallel one gathers in its own forward)."""
        return type(self.lm_head) is nn.Linear and self.lm_head.bias is None

    def _fold_final_norm(self) -> None:
        """Fold the final RMSNorm's weight into an untied lm_head, as ``DecoderLayer.fold_norm_weights``
        does for the layers' projections, so a skinny lm_head can take the norm as a per-row scale
        (``skinny.NormInput``). A tied head is the embedding table too and keeps the norm's weight."""
        if self.spec.tie_word_embeddings or not self._plain_lm_head():
            return
        fold_norm(self.model.norm, self.lm_head)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionFn) -> torch.Tensor:
        return self.model(input_ids, positions, attn)

    def reset_rope_cache(self, device: torch.device | str | None = None) -> None:
        """Rebuild the RoPE tables (``DecoderModel.reset_rope_cache``)."""
        self.model.reset_rope_cache(device)

    def _soft_cap(self, logits: torch.Tensor) -> torch.Tensor:
        """cap * tanh(logits / cap) in place where the family caps its logits (``spec.final_softcap``), with
        transformers' rounding points (each op rounded to the logits' dtype)."""
        cap = self.spec.final_softcap
        return logits if cap is None else logits.div_(cap).tanh_().mul_(cap)

    def gemv_logits(self, rows: int) -> bool:
        """Whether a decode step of ``rows`` tokens takes its final RMSNorm and lm_head in one GEMV."""
        return lm_head_gemv_on() and self.model.gemv_rows(rows) and self._plain_lm_head()

    def decode_logits(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionFn, out: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """Logits of every row, for a step whose every token is sampled (decode), into ``out`` when given.

        Where the fused kernels allow it, the final RMSNorm rides in the lm_head's own kernel: at the
        fused GEMV's rows in the GEMV's prologue, at the skinny GEMM's (an untied head, its norm weight
        folded in, ``lm_head_skinny``) as the per-row scale of its sums. One launch, PDL-chained, where
        an RMSNorm kernel and cuBLAS (and the memset it adds) each cost a launch gap; and it lets a
        PDL-launched kernel reading the logits (the greedy argmax) start early. Graph and eager decode
        steps both come here, so their logits agree to the bit."""
        rows = input_ids.shape[0]
        gemv = self.gemv_logits(rows)
        cfg = self.lm_head_skinny.get(row_class(rows))  # empty unless the fused kernels are on
        if not gemv and cfg is None:
            return self.compute_logits(self.model(input_ids, positions, attn), out=out)
        pre = self.model.forward_pre_norm(input_ids, positions, attn)
        logits = logits_with_norm(
            pre,
            self.model.norm,
            self.lm_head.weight,
            gemv=gemv,
            config=cfg,
            gemv_pdl=self.lm_head_pdl,
            tail_pdl=self.logits_pdl,
            out=out,
        )
        if logits is None:
            return self.compute_logits(self.model.final_norm(pre), out=out)
        return self._soft_cap(logits)

    def compute_logits(self, hidden: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits for the rows of `hidden` the caller selected (usually each request's last token), in
        the model's dtype (as transformers returns them), into ``out`` when given.

        Not upcast: an argmax of bf16 logits is the argmax of their float copy, and the sampler upcasts
        only the rows it samples. At a few hundred rows the float copy of a 150k vocabulary (a conversion
        kernel, then a copy into a graph's output buffer) was a measurable slice of a decode step.
        """
        if out is not None and type(self.lm_head) is nn.Linear:  # a vocab-parallel head gathers first
            return self._soft_cap(torch.mm(hidden, self.lm_head.weight.t(), out=out))
        logits = self.lm_head(hidden)
        return self._soft_cap(logits if out is None else out.copy_(logits))
